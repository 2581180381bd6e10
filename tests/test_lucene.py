"""pyserini / Lucene: Java 21 setup, indexing, batch search, keyword export, BM25 baseline."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from coevo.retrieval import lucene

pytestmark = pytest.mark.java

DOCS = [
    ("t1", "Weather forecast: rain and temperature for any city"),
    ("t2", "Family tree builder for genealogy research"),
    ("t3", "Stock market prices and finance news"),
]


def test_ensure_java_is_idempotent_and_leaves_no_placeholder_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    lucene.ensure_java()
    lucene.ensure_java()
    import jnius_config

    assert "OPENAI_API_KEY" not in os.environ
    assert "21" in Path(os.environ["JAVA_HOME"]).name or "java-runtime" in os.environ["JAVA_HOME"]
    assert not any("jdk.incubator.vector" in o for o in jnius_config.options)


def test_build_and_batch_search(tmp_path: Path) -> None:
    index = lucene.build_lucene_index(iter(DOCS), tmp_path / "idx", threads=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no temporary folder left behind
    hits = lucene.search(index, {"q1": "rain forecast", "q2": "genealogy family", "q3": "   "}, k=2, threads=2)
    assert hits["q1"][0] == "t1" and hits["q2"][0] == "t2"
    assert hits["q3"] == [] and all(len(v) <= 2 for v in hits.values())


def test_index_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="duplicate id 't1'"):
        lucene.build_lucene_index([("t1", "a"), ("t1", "b")], tmp_path / "dup", threads=1)
    assert not (tmp_path / "dup").exists()  # nothing half-written
    with pytest.raises(ValueError, match="no documents"):
        lucene.build_lucene_index([], tmp_path / "empty", threads=1)
    with pytest.raises(FileNotFoundError, match="not a Lucene index"):
        lucene.search(tmp_path, {"q": "x"}, k=1)


def test_export_keyword_index_searches_back(tmp_path: Path) -> None:
    items = {"i1": ["Family Tree", "genealogy"], "i2": ["tree"], "i3": ["weather", "rain"], "i4": []}
    index = lucene.export_keyword_index(items, tmp_path / "kw", threads=1)
    hits = lucene.search_keywords(index, {"q1": ["family tree"], "q2": ["tree", "rain"], "q3": ["unknown"], "q4": []}, k=10)
    assert hits["q1"] == ["i1"]  # the phrase matches as one token, not "tree"
    assert sorted(hits["q2"]) == ["i2", "i3"]
    assert hits["q3"] == [] and hits["q4"] == []
    assert lucene.keyword_token("Family  Tree") == "family_tree"


def test_bm25_baseline_on_a_small_dataset(tmp_path: Path) -> None:
    from coevo.data.schema import Dataset

    dataset = Dataset(
        items=pd.DataFrame({"item_id": [d[0] for d in DOCS], "title": ["weather", "family", "stocks"], "text": [d[1] for d in DOCS]}),
        queries=pd.DataFrame(
            {"query_id": ["a", "b", "c", "d"], "text": ["will it rain tomorrow", "my ancestors genealogy", "share prices", "rain"],
             "split": ["test", "test", "test", "train"]}
        ),
        qrels=pd.DataFrame({"query_id": ["a", "b", "c", "d"], "item_id": ["t1", "t2", "t1", "t1"], "grade": [1, 1, 1, 1]}),
        name="tiny",
    )
    metrics = lucene.bm25_baseline(dataset, split="test", k=10, index_dir=tmp_path / "bm25", threads=1)
    assert set(metrics) >= {"precision", "recall", "f1", "mrr@10", "ndcg@10", "recall@10"}
    assert "recall@100" not in metrics  # cut-offs above k are not reported
    # a and b find their tool first; c (share prices -> t3, judged t1) does not rank t1 first.
    assert metrics["mrr@10"] < 1.0 and metrics["mrr@10"] >= 2 / 3
    assert (tmp_path / "bm25").is_dir()


def test_relative_paths_follow_python_cwd_after_the_jvm_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The JVM keeps the working directory it started in; relative paths must still mean
    # the directory Python is in now (flows chdir into a project folder).
    lucene.build_lucene_index([("warm", "start the jvm")], tmp_path / "warm")
    monkeypatch.chdir(tmp_path)
    lucene.build_lucene_index([("a", "red apple"), ("b", "green pear")], "rel/index")
    assert (tmp_path / "rel" / "index").is_dir()
    assert lucene.search("rel/index", {"q": "apple"}, k=2)["q"] == ["a"]


def test_bm25_parameters_change_the_ranking(tmp_path: Path) -> None:
    # "apple" once in a one-word document vs twice in a long one: full length
    # normalisation (b=1) favours the short document, none (b=0) the repeated term.
    docs = [("short", "apple"), ("long", "apple apple banana cherry date elder fig grape honeydew kiwi")]
    index = lucene.build_lucene_index(docs, tmp_path / "idx", threads=1)
    assert lucene.search(index, {"q": "apple"}, k=2, b=1.0)["q"] == ["short", "long"]
    assert lucene.search(index, {"q": "apple"}, k=2, b=0.0)["q"] == ["long", "short"]
    with pytest.raises(ValueError, match="b must lie in"):
        lucene.search(index, {"q": "apple"}, b=1.5)
    with pytest.raises(ValueError, match="k1 must be >= 0"):
        lucene.search(index, {"q": "apple"}, k1=-1)


def test_the_documented_analyzer_stems_and_drops_stopwords(tmp_path: Path) -> None:
    assert "Porter" in lucene.ANALYZER and "stopwords" in lucene.ANALYZER
    index = lucene.build_lucene_index([("a", "The running dogs"), ("b", "family trees")], tmp_path / "idx", threads=1)
    hits = lucene.search(index, {"stop": "the", "stem": "runs dog", "plural": "tree"}, k=5)
    assert hits == {"stop": [], "stem": ["a"], "plural": ["b"]}


def test_bm25_rankings_serve_several_splits_from_one_index(tmp_path: Path) -> None:
    from coevo.data.schema import Dataset

    dataset = Dataset(
        items=pd.DataFrame({"item_id": ["t1", "t2"], "title": ["Weather", "Genealogy"], "text": ["rain forecast", None]}),
        queries=pd.DataFrame({"query_id": ["a", "b", "c"], "text": ["rain", "genealogy", "the"], "split": ["val", "test", "test"]}),
        qrels=pd.DataFrame({"query_id": ["a", "b"], "item_id": ["t1", "t2"], "grade": [1, 1]}),
        name="tiny",
    )
    assert list(lucene.item_documents(dataset)) == [("t1", "Weather rain forecast"), ("t2", "Genealogy")]
    runs = lucene.bm25_rankings(dataset, ["val", "test"], k=5, index_dir=tmp_path / "bm25", threads=1)
    assert runs == {"val": {"a": ["t1"]}, "test": {"b": ["t2"], "c": []}}
    metrics = lucene.bm25_baseline(dataset, "test", k=1000, threads=1)
    assert {f"ndcg@{k}" for k in (1, 3, 5, 10, 100, 1000)} <= set(metrics) and metrics["mrr@1"] == 1.0
