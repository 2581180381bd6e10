"""compute.backend=ray gives what the local backend gives, on a local Ray instance (2 CPUs).

- CoGR item keywords (greedy, the `tiny` generator), GRAPE corpus embeddings (MiniLM, offline)
  and CoHyDE S2 descriptions (greedy, `tiny`) are identical on `local` and on Ray Data shards
  spread over 2 worker actors;
- the independent evaluate steps (the baselines) run as Prefect tasks on Ray (prefect-ray),
  with the results and the cache of the default runner.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from coevo.config import load_params
from coevo.data.schema import Dataset
from tests.conftest import REPO_ROOT, make_project, task_states

TOOLS = [(f"t{i:02d}", f"Tool {i} {word}", f"Does {word} things for task {i}: {word} {word} search.")
         for i, word in enumerate(["weather", "flights", "translate", "currency", "recipes", "music", "maps", "news",
                                   "stocks", "email", "calendar", "photos", "notes", "sports", "movies", "books"])]
# 16 items in model batches of 4 = 4 shards; compute.batch_size 4 = one shard per worker call.
RAY = ["compute.backend=ray", "compute.workers=2", "compute.batch_size=4", "compute.cpus_per_worker=1"]


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    items = pd.DataFrame([{"item_id": i, "title": t, "text": d} for i, t, d in TOOLS])
    queries, qrels = [], []
    for i, title, _ in TOOLS:
        for j, (template, split) in enumerate([("I need {}", "train"), ("help me with {}", "train"),
                                               ("what about {}", "val"), ("show me {}", "test")]):
            queries.append({"query_id": f"{i}-{j}", "text": template.format(title.lower()), "split": split})
            qrels.append({"query_id": f"{i}-{j}", "item_id": i, "grade": 1})
    folder = tmp_path_factory.mktemp("toy") / "data"
    return Dataset(items=items, queries=pd.DataFrame(queries), qrels=pd.DataFrame(qrels), name="toy").save(folder)


def _talkative(generator):
    """An untrained `tiny` model only repeats its last prompt token (a newline): random LoRA B
    matrices make it write varied text, so that equal outputs mean something."""
    import torch

    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in generator.model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=rng) * 2.0)
    return generator


def _params(*extra: str):
    return load_params(REPO_ROOT / "params.yaml",
                       ["cogr.generator=tiny", "cogr.max_empty_share=1.0", "grape.generator=tiny", "cohyde.generator=tiny", *extra])


def test_cogr_item_keywords_are_identical_on_ray(toy, ray_instance, tmp_path, monkeypatch):
    from coevo.methods.cogr import CoGR
    from coevo.retrieval import keywords

    raw: list[str] = []  # the completions before parsing (an untrained model's keyword sets are mostly empty)
    parse = keywords.parse_keywords
    monkeypatch.setattr(keywords, "parse_keywords", lambda text, *a, **k: raw.append(text) or parse(text, *a, **k))
    local = CoGR(tmp_path / "local", _params(), toy, generation_batch_size=4)
    generator = _talkative(local._new_generator("tiny"))  # in memory (LoRA), as after SFT: saved for the workers
    want = local._index_items(generator, seed=7)
    want_raw, raw[:] = list(raw), []
    on_ray = CoGR(tmp_path / "ray", _params(*RAY), toy, generation_batch_size=4)
    got = on_ray._index_items(generator, seed=7)
    assert got == want
    assert raw == want_raw and len(raw) == len(TOOLS) and any(t.strip() for t in raw)
    assert not (tmp_path / "ray" / "scratch").exists(), "the checkpoint saved for the workers was left behind"


@pytest.mark.full  # full tier: the same Ray corpus pass as CoGR's below, with the text encoder
def test_grape_corpus_embeddings_are_identical_on_ray(toy, ray_instance, tmp_path):
    from coevo.methods.grape import Grape
    from coevo.models.encoder import TextRetriever

    encoder = TextRetriever("all-minilm-l6-v2", batch_size=4).model  # 16 items = 4 shards of 4 for 2 workers
    local = Grape(tmp_path / "local", _params(), toy, retriever=TextRetriever("all-minilm-l6-v2", batch_size=4,
                                                                              model=encoder))
    on_ray = Grape(tmp_path / "ray", _params(*RAY), toy, retriever=TextRetriever("all-minilm-l6-v2", batch_size=4,
                                                                                 model=encoder))
    want, got = local.build_index(), on_ray.build_index()
    assert got["n_items"] == len(TOOLS)
    assert got["content_hash"] == want["content_hash"]  # ids and float32 bytes of every vector


@pytest.mark.full  # full tier: the same Ray generation pass as CoGR's item keywords above
def test_cohyde_descriptions_are_identical_on_ray(toy, ray_instance, tmp_path):
    from coevo.methods.cohyde import CoHyDE

    local = CoHyDE(tmp_path / "local", _params(), toy)
    generator = _talkative(local._base_generator())
    queries = local.train_queries()
    want = local.describe(generator, queries, what="S2")
    got = CoHyDE(tmp_path / "ray", _params(*RAY), toy).describe(generator, queries, what="S2")
    assert got == want
    assert len(want) == len(queries) and any(d.strip() for d in want)


def test_generation_shards_are_the_local_batches():
    from coevo.compute import embedding_shards, generation_shards, shard_seed

    class Tok:  # one token per character
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(text)}

    texts, shards = generation_shards(Tok(), ["ccc", "a", "bb", "a2", "dddd"], 2)
    assert texts == ["ccc", "a", "bb", "a2", "dddd"]
    assert shards == [[1, 2], [3, 0], [4]]  # by (token length, position), 2 at a time
    assert sorted(i for s in embedding_shards(["a", "bbb", "cc"], 2) for i in s) == [0, 1, 2]
    assert shard_seed(42, 0) != shard_seed(42, 1) and shard_seed(42, 1) == shard_seed(42, 1)


@pytest.mark.java
def test_baselines_run_on_ray_with_the_default_runners_results_and_cache(prefect_server, ray_instance, chdir,
                                                                         tmp_path):
    from prefect import flow
    from prefect.context import FlowRunContext

    from coevo.orchestration.pipeline import Pipeline
    from coevo.orchestration.prefect_tasks import execute, fan_out

    chdir(make_project(tmp_path / "project"))

    @flow(name="baselines-fan-out")
    def baselines(overrides: list[str]) -> dict:
        pipe = Pipeline("cogr", load_params("params.yaml", overrides))
        execute(pipe.prepare())
        execute(pipe.validate())
        with fan_out(pipe) as submit:
            waiting = {step.name: submit(step) for step in pipe.baseline_steps()}
            results = {name: wait() for name, wait in waiting.items()}
        return {"results": results, "flow_run_id": str(FlowRunContext.get().flow_run.id)}

    first = baselines(RAY)  # on Ray: every baseline computed there
    names = sorted(first["results"])
    assert names == ["baseline-bm25", "baseline-dense"]
    states = task_states(first["flow_run_id"])
    assert all(states[(n, "Completed")] == 1 for n in names), states
    again = baselines(RAY)  # on Ray again: cache hits
    states = task_states(again["flow_run_id"])
    assert all(states[(n, "Cached")] == 1 for n in names), states
    local = baselines([])  # the default runner reads the same cache, gets the same results
    states = task_states(local["flow_run_id"])
    assert all(states[(n, "Cached")] == 1 for n in names), states
    assert local["results"] == first["results"] == again["results"]
    assert all(first["results"][n] for n in names)
