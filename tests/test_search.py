"""`coevo search` / `coevo evaluate` and the retrievers behind them, for CoGR, GRAPE and CoHyDE.

Each method trains once per session on a toy MetaTool set with `tiny` generators (the
serving tests in test_pyfunc, test_registry and test_serve_http reuse the same runs:
:func:`trained` resumes a finished run in no time). What is checked: the records a search
returns, that `evaluate` reproduces the method's own evaluation of the test split, saving
and loading a retriever, bad queries, the CLI (text, JSON lines, a file of queries, a run
directory), and that pyserini's LuceneSearcher over the Lucene export of CoGR's learned item
index returns the same top-10 as `coevo search`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from coevo.config import Params, load_params
from coevo.serving.search import QueryError, Retriever, from_run
from tests.conftest import REPO_ROOT, make_toy_metatool

pytestmark = pytest.mark.slow

DATASET = "toy"
# Small and fast. CoGR: Algorithm 1 seeds from SmolLM2 (real words), one shared `tiny` generator
# fitted hard to them, so item and query keywords overlap; GRAPE: 3 GRPO steps; CoHyDE: no round
# (vanilla HyDE with the S1a encoder is the chosen stage).
SETTINGS = {
    "cogr": ["cogr.generator=tiny", "cogr.seed_generator=smollm2-135m", "cogr.shared_generator=true",
             "cogr.rounds=0", "cogr.lora.enabled=false", "cogr.sft.epochs=20", "cogr.sft.learning_rate=1e-2",
             "cogr.sft.batch_size=4", "cogr.sampling.max_new_tokens=16", "cogr.n_query_keywords=4",
             "cogr.m_item_keywords=3"],
    "grape": ["grape.generator=tiny", "grape.grpo.steps=3", "grape.eval_every=2", "grape.grpo.batch_size=4",
              "grape.grpo.num_generations=2", "grape.grpo.max_completion_length=8",
              "grape.sampling.max_new_tokens=8", "grape.lora.target_modules=[q_proj, v_proj]"],
    "cohyde": ["cohyde.generator=tiny", "cohyde.rounds=0", "cohyde.max_new_tokens=12", "cohyde.lora.enabled=false",
               "cohyde.warmup.learning_rate=3e-3", "cohyde.warmup.batch_size=16", "cohyde.warmup_max_examples=16",
               "cohyde.warmup_formats_per_item=1", "cohyde.encoder_training.batch_size=8",
               "cohyde.max_train_queries=8"],
}
QUERIES = ["find me a research paper about neural networks", "I want to rent a flat downtown"]


@dataclass(frozen=True)
class Trained:
    method: str
    root: Path  # a project folder: data/processed/<dataset>, data/models/<method>/<dataset> (data.root = data)
    params: Params
    overrides: list[str]

    @property
    def run_dir(self) -> Path:
        return self.root / "data" / "models" / self.method / DATASET

    @property
    def data_dir(self) -> Path:
        return self.root / "data" / "processed" / DATASET


def overrides(method: str) -> list[str]:
    return ["seed=0", "data.root=data", f"data.dataset={DATASET}", *SETTINGS[method]]


def trained(tmp_path_factory: pytest.TempPathFactory, method: str, *extra: str, project: str = "serving") -> Trained:
    """The session's finished run of ``method`` (trained on first use, resumed after); ``extra``
    overrides go into a ``project`` folder of their own."""
    from coevo.data.loaders import load_source
    from coevo.methods.base import method_class

    root = tmp_path_factory.getbasetemp() / project
    data_dir = root / "data" / "processed" / DATASET
    if not (data_dir / "dataset.json").exists():
        source = make_toy_metatool(root / "source")
        load_source("metatool", source, seed=0, val_fraction=0.25, test_fraction=0.25, name=DATASET).save(data_dir)
    sets = [*overrides(method), *extra]
    result = Trained(method, root, load_params(REPO_ROOT / "params.yaml", sets), sets)
    method_class(method)(result.run_dir, result.params, data_dir).run()
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Trained]:
    return {m: trained(tmp_path_factory, m) for m in SETTINGS}


@pytest.fixture(scope="module")
def retrievers(runs) -> dict[str, Retriever]:
    return {m: from_run(m, t.run_dir, t.params, t.data_dir) for m, t in runs.items()}


def _dataset(run: Trained):
    from coevo.data.schema import Dataset

    return Dataset.load(run.data_dir)


# --------------------------------------------------------------------------- search records
@pytest.mark.parametrize("method,generated", [("cogr", "keywords"), ("grape", "rewrite"), ("cohyde", "description")])
def test_search_returns_ranked_items_with_what_the_generator_wrote(retrievers, method, generated):
    retriever = retrievers[method]
    records = retriever.search(QUERIES, k=3)
    assert [r["query"] for r in records] == QUERIES
    item_ids = set(retriever.items["item_id"])
    for record in records:
        assert set(record) == {"query", generated, "results"}
        hits = record["results"]
        assert len(hits) <= 3 and all(set(h) == {"item_id", "title", "score"} for h in hits)
        assert {h["item_id"] for h in hits} <= item_ids
        assert all(h["title"] == retriever.titles[h["item_id"]] for h in hits)
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
    if method == "cogr":
        assert all(isinstance(r["keywords"], list) for r in records)
    else:
        assert len(records[0]["results"]) == 3  # dense retrieval ranks the whole corpus
    alone = retriever.search(QUERIES[0], k=1)[0]["results"]  # batched alone: the same up to float rounding
    assert [h["item_id"] for h in alone] == [h["item_id"] for h in records[0]["results"][:1]]
    assert [h["score"] for h in alone] == pytest.approx([h["score"] for h in records[0]["results"][:1]], abs=1e-5)
    assert retriever.name == f"coevo-{method}-{DATASET}"


def test_a_grape_model_trained_in_mix_mode_searches_the_query_embedding_plus_the_weighted_rewrite(retrievers,
                                                                                                monkeypatch):
    from coevo.retrieval.dense import l2_normalize

    retriever = retrievers["grape"]
    monkeypatch.setitem(retriever.settings, "query_mode", "mix")
    monkeypatch.setitem(retriever.settings, "mix_weight", 0.25)
    rewrites = ["weather forecast by city", None]  # a written rewrite, and a malformed one (the query alone)
    monkeypatch.setattr(retriever, "generate", lambda queries: rewrites[: len(queries)])
    queries = QUERIES[:2]
    records = retriever.search(queries, k=3)
    expected = l2_normalize(retriever.embed(queries))
    expected[0] += 0.25 * l2_normalize(retriever.embed(rewrites[:1]))[0]
    ids, scores = retriever.index.search(expected, 3)
    assert [r["rewrite"] for r in records] == rewrites  # the record shows what the rewriter wrote
    assert [[h["item_id"] for h in r["results"]] for r in records] == [list(row) for row in ids]
    for record, row in zip(records, scores):
        assert [h["score"] for h in record["results"]] == pytest.approx(list(row), abs=1e-5)


def test_a_grape_model_trained_in_expand_mode_searches_the_query_followed_by_its_rewrite(retrievers, monkeypatch):
    retriever = retrievers["grape"]
    monkeypatch.setitem(retriever.settings, "query_mode", "expand")
    records = retriever.search(QUERIES, k=3)
    for query, record in zip(QUERIES, records):
        # the record shows what the rewriter wrote (None: malformed, as the tiny model's are); the
        # retriever embeds the query followed by it, or the query as typed
        rewrite = record["rewrite"]
        ranked = retriever.rank([f"{query} {rewrite}" if rewrite else query], 3)[0]
        assert [h["item_id"] for h in record["results"]] == [i for i, _ in ranked]
    # the query moves the scores: the search is not of the rewrite alone (replace mode's)
    alone = retriever.rank([rec["rewrite"] or "" for rec in records], 3)
    assert [[h["score"] for h in rec["results"]] for rec in records] != [[s for _, s in hits] for hits in alone]


def test_cogr_ranks_the_items_sharing_a_keyword_by_bm25_ties_by_id(retrievers, texts):
    from coevo.retrieval.bm25 import KeywordBM25

    retriever = retrievers["cogr"]
    assert any(retriever.item_keywords.values()), "the learned item index is empty"
    bm25 = KeywordBM25(retriever.item_keywords)
    for record in retriever.search(texts, k=None):
        sharing = {i for i, kws in retriever.item_keywords.items() if set(kws) & set(record["keywords"])}
        assert {h["item_id"] for h in record["results"]} == sharing  # the retrieved set, whole
        assert [h["item_id"] for h in record["results"]] == bm25.rank(record["keywords"])
        keys = [(-h["score"], h["item_id"]) for h in record["results"]]
        assert keys == sorted(keys)
    assert any(r["results"] for r in retriever.search(texts, k=10)), "no test query retrieves anything"


@pytest.fixture(scope="module")
def texts(runs) -> list[str]:
    """The test split's query texts."""
    return [str(t) for t in _dataset(runs["cogr"]).queries_in("test")["text"]]


# --------------------------------------------------------------------------- evaluation
def test_evaluate_reproduces_the_methods_own_test_evaluation(runs, retrievers):
    from coevo.methods.base import method_class

    for method in ("cogr", "grape", "cohyde"):
        run, retriever = runs[method], retrievers[method]
        dataset = _dataset(run)
        mine = retriever.evaluate(dataset, "test")
        assert mine.n_queries == len(dataset.relevant("test"))
        instance = method_class(method)(run.run_dir, run.params, run.data_dir)
        phase = retriever.manifest["phase"]
        if method == "cogr":
            theirs = instance.evaluate(instance.phase_index(phase), "test")
            names = ("f1", "precision", "recall", "ndcg@10", "recall@100")
        elif method == "grape":
            theirs = instance.evaluate("trained", splits=["test"], store=False)["splits"]["test"]
            names = ("recall@1", "recall@10", "ndcg@10", "mrr")
        else:
            theirs = instance.evaluate(phase, splits=["test"], store=False)["splits"]["test"]["overall"]
            names = ("ndcg@5", "recall@5")
        means = mine.means()
        for name in names:
            assert means[name] == pytest.approx(theirs[name], abs=1e-9), (method, name)


# --------------------------------------------------------------------------- files
@pytest.mark.parametrize("method", ["cogr", "cohyde"])
def test_a_saved_retriever_loads_and_searches_the_same(retrievers, tmp_path, method):
    retriever = retrievers[method]
    files = retriever.save(tmp_path / "model")
    assert {"manifest", "params", "items", "generator", "index"} <= set(files)
    assert (method == "cohyde") == ("encoder" in files)
    assert list((tmp_path / "model" / "generator").rglob("*.safetensors"))
    manifest = json.loads(files["manifest"].read_text())
    assert manifest["method"] == method and manifest["dataset"] == DATASET and manifest["phase"]
    assert json.loads(files["params"].read_text())[method]["generator"] == "tiny"
    loaded = Retriever.load(tmp_path / "model")
    assert loaded.search(QUERIES, k=5) == retriever.search(QUERIES, k=5)
    with pytest.raises(FileExistsError):
        retriever.save(tmp_path / "model")


def test_bad_queries_and_k_are_refused_with_the_reason(retrievers):
    retriever = retrievers["grape"]
    for queries, match in [([""], "query 0: empty"), (["ok", "   "], "query 1: empty"), ([], "no query"),
                           (["ok", 3], "query 1: expected a string"), (["x" * 5000], "at most 2000")]:
        with pytest.raises(QueryError, match=match):
            retriever.search(queries)
    for k in (0, 1001, 2.5, "3"):
        with pytest.raises(QueryError, match="k must be"):
            retriever.search(["ok"], k=k)


def test_a_run_directory_needs_the_params_it_was_trained_with(runs):
    run = runs["cogr"]
    other = load_params(REPO_ROOT / "params.yaml", [*run.overrides, "cogr.n_query_keywords=5"])
    with pytest.raises(FileNotFoundError, match="trained with other params"):
        from_run("cogr", run.run_dir, other, run.data_dir)


# --------------------------------------------------------------------------- CLI
def cli() -> typer.Typer:
    """The `coevo` commands of this module on an app of their own (coevo/cli/__init__ adds them to `coevo`)."""
    from coevo.cli import search

    app = typer.Typer()
    search.register_top_level(app)
    return app


def _run_dir_args(run: Trained) -> list[str]:
    return ["-p", str(REPO_ROOT / "params.yaml"), *[a for s in run.overrides for a in ("--set", s)]]


def test_cli_search_prints_ranked_items_json_lines_and_a_file_of_queries(runs, retrievers, tmp_path):
    run, runner = runs["cogr"], CliRunner()
    expected = retrievers["cogr"].search(QUERIES, k=4)
    as_json = runner.invoke(cli(), ["search", "--model", str(run.run_dir), QUERIES[0], "--k", "4", "--json",
                                    *_run_dir_args(run)])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout.strip().splitlines()[-1]) == expected[0]

    text = runner.invoke(cli(), ["search", "--model", str(run.run_dir), QUERIES[1], "--k", "4", *_run_dir_args(run)])
    assert text.exit_code == 0, text.output
    assert "keywords:" in text.stdout and QUERIES[1] in text.stdout
    for hit in expected[1]["results"]:
        assert hit["item_id"] in text.stdout

    queries = tmp_path / "queries.txt"
    queries.write_text(f"{QUERIES[0]}\n\n{QUERIES[1]}\n{QUERIES[0]}\n")
    saved = tmp_path / "saved"
    retrievers["cogr"].save(saved)
    batch = runner.invoke(cli(), ["search", "--model", str(saved), "--file", str(queries), "--json", "--k", "4",
                                  "--batch-size", "2"])
    assert batch.exit_code == 0, batch.output
    lines = [json.loads(line) for line in batch.stdout.strip().splitlines()]
    assert lines == [expected[0], expected[1], expected[0]]

    neither = runner.invoke(cli(), ["search", "--model", str(saved)])
    assert neither.exit_code == 2 and "give one query" in neither.output
    missing = runner.invoke(cli(), ["search", "--model", str(tmp_path / "nope"), "q"])
    assert missing.exit_code == 2 and "no such folder" in missing.output


def test_a_run_folder_brings_its_own_params_so_search_needs_nothing_re_passed(runs, retrievers, tmp_path,
                                                                              monkeypatch):
    import shutil

    from coevo.layout import RUN_PARAMS, write_run_params

    run = runs["cogr"]
    root = tmp_path / "copy"
    shutil.copytree(run.root, root)
    run_dir = root / run.run_dir.relative_to(run.root)
    monkeypatch.chdir(REPO_ROOT)  # the default -p params.yaml is the project's, not what the run was trained with
    bare = ["search", "--model", str(run_dir), QUERIES[0], "--k", "4", "--json"]
    refused = CliRunner().invoke(cli(), bare)
    assert refused.exit_code == 2 and "trained with other params" in " ".join(refused.output.split()), refused.output

    written = write_run_params(run_dir, run.params)
    assert written == run_dir / RUN_PARAMS and load_params(written) == run.params
    found = CliRunner().invoke(cli(), bare)
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout.strip().splitlines()[-1]) == retrievers["cogr"].search(QUERIES[:1], k=4)[0]


@pytest.mark.parametrize("method", ["cogr", "grape", "cohyde"])
def test_coevo_search_over_the_test_queries_gives_the_final_evaluations_per_query_values(runs, tmp_path, method):
    """Serving runs evaluation's code: the rankings `coevo search --json` returns for every test query
    score, query by query, exactly what the method's final evaluation measured for the served phase."""
    _assert_search_equals_the_final_evaluation(runs[method], tmp_path)


def test_a_cohyde_run_that_encodes_the_query_with_its_description_serves_what_it_evaluated(tmp_path_factory,
                                                                                          tmp_path):
    """cohyde.encode=query_and_description reaches serving through the run: the record shows the
    description, the ranking is of the query followed by it, and search equals the final evaluation."""
    run = trained(tmp_path_factory, "cohyde", "cohyde.encode=query_and_description", project="serving-query")
    retriever = from_run("cohyde", run.run_dir, run.params, run.data_dir)
    assert retriever.settings["encode"] == "query_and_description"
    records = retriever.search(QUERIES, k=3)
    for query, record in zip(QUERIES, records):
        searched = f"{query}\n{record['description']}".rstrip()
        assert retriever.searched([query], [record["description"]]) == [searched]
        assert [h["item_id"] for h in record["results"]] == [i for i, _ in retriever.rank([searched], 3)[0]]
    _assert_search_equals_the_final_evaluation(run, tmp_path)


def _assert_search_equals_the_final_evaluation(run: Trained, tmp_path: Path) -> None:
    from coevo.methods.base import method_class
    from coevo.retrieval.metrics import ranked_evaluation

    method = run.method
    dataset = _dataset(run)
    final = method_class(method)(run.run_dir, run.params, run.data_dir).final_evaluation("test")
    served = [r for r in final["rows"] if r["phase"] == final["best_phase"]][-1]["per_query"]
    qrels = dataset.relevant("test")
    frame = dataset.queries_in("test")
    pairs = [(str(q), str(t)) for q, t in zip(frame["query_id"], frame["text"]) if str(q) in qrels]
    queries = tmp_path / "test_queries.txt"
    queries.write_text("".join(f"{t}\n" for _, t in pairs))
    found = CliRunner().invoke(cli(), ["search", "--model", str(run.run_dir), "--file", str(queries), "--json",
                                       "--k", "10", *_run_dir_args(run)])
    assert found.exit_code == 0, found.output
    records = [json.loads(line) for line in found.stdout.strip().splitlines()]
    assert [r["query"] for r in records] == [t for _, t in pairs]
    rankings = {q: [hit["item_id"] for hit in r["results"]] for (q, _), r in zip(pairs, records)}
    searched = ranked_evaluation(rankings, qrels, (1, 5, 10), query_ids=list(rankings)).per_query
    compared = [m for m in ("ndcg@10", "recall@10", "ndcg@5", "recall@5") if m in served]
    assert compared, sorted(served)
    for metric in compared:
        assert set(served[metric]) == set(rankings), metric
        for query_id, value in served[metric].items():
            assert searched[metric][query_id] == pytest.approx(value, abs=1e-9), (method, metric, query_id)


def test_cli_evaluate_prints_the_final_table_with_the_baseline_at_val_chosen_k(runs, tmp_path):
    run = runs["grape"]
    out = tmp_path / "table.json"
    result = CliRunner().invoke(cli(), ["evaluate", str(run.data_dir), "--model", str(run.run_dir),
                                        "--baselines", "bm25", "--out", str(out), *_run_dir_args(run)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    table = json.loads(out.read_text())
    labels = [r["label"] for r in table["rows"]]
    assert labels[-1] == f"coevo-grape-{DATASET} phase trained (test)"
    assert any(label.startswith("BM25 @k*=") and label.endswith("(val)") for label in labels)
    model = table["rows"][-1]
    assert model["n_queries"] == len(_dataset(run).relevant("test"))
    assert [c["name"] for c in table["comparisons"]] and {c["name"] for c in table["comparisons"]} == {"vs best baseline"}
    assert all(c["ci_low"] <= c["mean"] <= c["ci_high"] for c in table["comparisons"])
    assert "BM25" in result.stdout and "95% CI" in result.stdout


# --------------------------------------------------------------------------- pyserini
def lucene_top(index_dir: Path, keyword_sets: list[list[str]], k: int = 10) -> list[list[tuple[str, float]]]:
    """pyserini's LuceneSearcher over a keyword export, queried with keyword sets (as exported)."""
    from coevo.retrieval.lucene import ensure_java, keyword_token

    ensure_java()
    from pyserini.pyclass import autoclass
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(index_dir.resolve()))
    searcher.set_analyzer(autoclass("org.apache.lucene.analysis.core.WhitespaceAnalyzer")())
    try:
        out = []
        for keywords in keyword_sets:
            text = " ".join(dict.fromkeys(t for t in map(keyword_token, keywords) if t))
            out.append([(h.docid, float(h.score)) for h in searcher.search(text, k=k)] if text else [])
        return out
    finally:
        searcher.close()


# Lucene keeps each document's length in one byte (SmallFloat), so its BM25 scores differ from
# bm25s's exact ones by up to ~0.2% (same formula, k1 = 0.9, b = 0.4): items whose scores lie
# that close are ties, and their order (Lucene: by internal doc id; coevo: by item id) may differ.
RELATIVE_TIE = 5e-3


def assert_same_top(mine: list[tuple[str, float]], lucene: list[tuple[str, float]], score_of: dict[str, float]):
    """The same top-k up to near-ties: the same length; every item of either list scores (by
    coevo's exact BM25) within RELATIVE_TIE of the k-th score or above; strictly better items
    are in both; Lucene's order never puts a clearly worse item before a better one."""
    assert len(lucene) == len(mine), (mine, lucene)
    if not mine:
        return
    floor = mine[-1][1]
    tie = RELATIVE_TIE * max(abs(floor), 1e-9)
    above = {i for i, s in mine if s > floor + tie}
    assert above <= {i for i, _ in lucene}, (mine, lucene)
    assert all(score_of[i] >= floor - tie for i, _ in lucene), (mine, lucene)
    exact = [score_of[i] for i, _ in lucene]
    assert all(a >= b - RELATIVE_TIE * max(abs(a), 1e-9) for a, b in zip(exact, exact[1:])), (mine, lucene)
    for (i, s) in lucene:
        assert s == pytest.approx(score_of[i], rel=RELATIVE_TIE)


@pytest.mark.java
def test_lucene_export_of_the_learned_index_gives_the_top_10_of_coevo_search(runs, retrievers, texts, tmp_path):
    from coevo.methods.cogr import CoGR

    run, retriever = runs["cogr"], retrievers["cogr"]
    method = CoGR(run.run_dir, run.params, run.data_dir)
    exported = method.exports(tmp_path / "indexes", {"best_phase": retriever.manifest["phase"]})
    records = retriever.search(texts, k=10)
    found = lucene_top(Path(exported["lucene_dir"]), [r["keywords"] for r in records])
    nonempty = 0
    for record, lucene in zip(records, found):
        scores = retriever.bm25.scores(record["keywords"])
        score_of = {i: float(scores[retriever._position[i]]) for i in retriever.bm25.item_ids}
        assert_same_top([(h["item_id"], h["score"]) for h in record["results"]], lucene, score_of)
        nonempty += bool(lucene)
    assert nonempty, "no query of the test split retrieved anything: the comparison says nothing"


@pytest.mark.java
def test_lucene_and_coevo_agree_on_a_larger_keyword_index_with_ties(tmp_path):
    """The same check where it has teeth: 300 items, phrases, repeated keyword sets (exact ties)."""
    from coevo.retrieval.lucene import export_keyword_index
    from coevo.serving.search import CoGRRetriever

    rng = random.Random(0)
    vocab = [f"kw{i}" for i in range(40)] + ["family tree", "city map", "c#", "Weather Forecast"]
    items = {f"item{i:03d}": rng.sample(vocab, rng.randint(1, 12)) for i in range(300)}
    items.update({"dup-a": ["kw1", "kw2"], "dup-b": ["kw2", "kw1"], "empty": []})
    bm25 = CoGRRetriever({"settings": {}}, _items(items), None, items)
    export_keyword_index(items, tmp_path / "lucene")
    queries = [rng.sample(vocab, rng.randint(1, 5)) for _ in range(150)] + [["kw1", "kw2"], ["nothing"]]
    ranked = bm25.rank(queries, 10)
    found = lucene_top(tmp_path / "lucene", queries)
    for keywords, mine, lucene in zip(queries, ranked, found):
        scores = bm25.bm25.scores(keywords)
        score_of = {i: float(scores[bm25._position[i]]) for i in bm25.bm25.item_ids}
        assert_same_top(mine, lucene, score_of)
    assert found[-1] == [] and ranked[-1] == []
    assert [i for i, _ in ranked[-2][:2]] == ["dup-a", "dup-b"]  # an exact tie: by item id


def _items(keyword_sets: dict[str, list[str]]):
    import pandas as pd

    return pd.DataFrame({"item_id": list(keyword_sets), "title": list(keyword_sets), "text": ""})


def test_scores_of_dense_retrievers_are_cosine_similarities(retrievers):
    retriever = retrievers["cohyde"]
    record = retriever.search(QUERIES[:1], k=6)[0]
    emb = retriever.embed([record["description"]])[0]
    vectors = retriever.index.embeddings[retriever.index.rows([h["item_id"] for h in record["results"]])]
    assert np.allclose(vectors @ emb, [h["score"] for h in record["results"]], atol=1e-5)
