"""CoGR's context variants (cogr.item_context, cogr.query_context): the exact prompts each
changes, the snippets' source (the corpus, never the qrels), a bad value's error, and a run
with snippets that resumes byte-identically and serves the prompts its evaluation used."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from coevo.config import load_params
from coevo.methods import cogr as cogr_module
from coevo.methods.cogr import CoGR
from coevo.methods.cogr_context import SearchResults, item_prompt, query_prompt, snippet
from coevo.models.prompts import (ITEM_SYSTEM, ITEM_SYSTEM_SHORT, QUERY_SYSTEM, QUERY_SYSTEM_SHORT, item_messages,
                                  query_messages)
from tests.conftest import REPO_ROOT
from tests.test_cogr_train import OVERRIDES, TOOLS, _toy

ITEMS = pd.DataFrame([{"item_id": k, "title": t, "text": d} for k, (t, d) in TOOLS.items()])
SNIPPETS = ["search_results.k=2", "search_results.max_chars=30"]


def test_the_default_prompts_are_the_library_prompts_unchanged():
    assert query_prompt("rain in Paris?") == query_messages("rain in Paris?")
    assert item_prompt("Weather Forecast", "Get the weather.", "description") == item_messages(
        "Weather Forecast", "Get the weather.")


def test_the_short_system_prompt_changes_the_system_line_and_nothing_else():
    for full, short in [(query_prompt("rain in Paris?"), query_prompt("rain in Paris?", system_prompt="short")),
                        (item_prompt("Weather", "Get it.", "description"),
                         item_prompt("Weather", "Get it.", "description", "short"))]:
        assert short[1:] == full[1:]
        assert short[0]["role"] == "system" and len(short[0]["content"]) < len(full[0]["content"]) / 2
    assert query_prompt("q", system_prompt="short")[0]["content"] == QUERY_SYSTEM_SHORT
    assert item_prompt("t", "", "title_only", "short")[0]["content"] == ITEM_SYSTEM_SHORT
    with_results = query_prompt("q", ["Translator"], "short")[0]["content"]
    assert with_results.startswith(QUERY_SYSTEM_SHORT + " The query comes with search results")


def test_title_only_drops_the_description_and_nothing_else():
    assert item_prompt("Weather Forecast", "Get the weather.", "title_only") == [
        {"role": "system", "content": ITEM_SYSTEM},
        {"role": "user", "content": "Title: Weather Forecast\nKeywords:"},
    ]


def test_search_results_are_numbered_after_the_query():
    prompt = query_prompt("rain in Paris?", ["Weather Forecast: Get the weather ...", "Translator"])
    assert prompt[0]["content"].startswith(QUERY_SYSTEM + " The query comes with search results")
    assert prompt[1] == {"role": "user", "content": "Query: rain in Paris?\nSearch results:\n"
                         "1. Weather Forecast: Get the weather ...\n2. Translator\nKeywords:"}


def test_a_snippet_cuts_the_description_at_a_word():
    assert snippet("Weather Forecast", "Get the weather forecast, temperature and rain.", 20) == \
        "Weather Forecast: Get the weather ..."
    assert snippet("Translator", None, 20) == "Translator"


def test_snippets_come_from_bm25_over_the_corpus():
    results = SearchResults(ITEMS, k=2, max_chars=30)
    got = results.for_texts(["convert dollars to euro exchange rates", "cooking recipes with an ingredient",
                             "convert dollars to euro exchange rates"])
    assert got[0][0] == "Currency Converter: Convert money between ..."
    assert got[1][0] == "Recipe Finder: Find cooking recipes by ..."
    assert got[2] == got[0] and all(len(g) <= 2 for g in got)
    assert SearchResults.from_params(ITEMS, {"query_context": "none"}) is None


def test_a_bad_context_value_is_refused_with_its_key():
    with pytest.raises(ValueError, match=r"cogr\.query_context"):
        load_params(REPO_ROOT / "params.yaml", ["cogr.query_context=web"])
    with pytest.raises(ValueError, match=r"cogr\.item_context"):
        load_params(REPO_ROOT / "params.yaml", ["cogr.item_context=none"])


def _params(extra=()):
    return load_params(REPO_ROOT / "params.yaml", OVERRIDES + ["cogr.rounds=1", "cogr.query_side_only=true",
                                                              "cogr.query_context=search_results",
                                                              *(f"cogr.{s}" for s in SNIPPETS), *extra])


@pytest.mark.slow
def test_a_run_with_snippets_prompts_with_them_everywhere_and_resumes_byte_identically(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    data = _toy(tmp_path / "data")
    prompts: list = []
    original = cogr_module.CoGR._query_prompts

    def spy(self, ids):
        out = original(self, ids)
        prompts.extend(out)
        return out

    monkeypatch.setattr(cogr_module.CoGR, "_query_prompts", spy)
    full = CoGR(tmp_path / "full", _params(), data)
    history = full.run()
    # SFT targets, GRPO rollouts and the index builds: every query prompt carries its snippets.
    assert prompts and all("\nSearch results:\n1. " in p[1]["content"] for p in prompts)
    expected = SearchResults(full.dataset.items, k=2, max_chars=30).for_texts([full.query_text["weather-0"]])[0]
    assert query_prompt(full.query_text["weather-0"], expected) in prompts

    # A crash in the GRPO phase, then a resume: the same keywords and weights as the uninterrupted run.
    finish = cogr_module.CoGR._finish_phase

    def crash(self, spec, *args, **kwargs):
        if spec.index == 1:
            raise RuntimeError("simulated crash")
        return finish(self, spec, *args, **kwargs)

    monkeypatch.setattr(cogr_module.CoGR, "_finish_phase", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        CoGR(tmp_path / "crashed", _params(), data).run()
    monkeypatch.setattr(cogr_module.CoGR, "_finish_phase", finish)
    resumed = CoGR(tmp_path / "crashed", _params(), data).run()
    assert [r["eval"] for r in resumed] == [r["eval"] for r in history]
    for sub in ("keywords.json", "generators/query/model/model.safetensors"):
        assert (tmp_path / "crashed" / "phases" / "01_query" / sub).read_bytes() == \
            (full.phase_dir(1) / sub).read_bytes()

    # The knob is part of every key but the seeds'; the snippets of another k re-key the SFT.
    other = CoGR(tmp_path / "full", _params(["cogr.search_results.k=1"]), data)
    assert other.key("seed") == full.key("seed") and other.key("00_sft") != full.key("00_sft")

    # Serving builds its prompts from the same snippets: coevo search's keywords are the evaluation's.
    from coevo.serving.search import CoGRRetriever

    retriever = CoGRRetriever.from_run(tmp_path / "full", _params(), data)
    ids = sorted(full.dataset.queries_in("test")["query_id"])
    served = retriever.generate([full.query_text[q] for q in ids])
    best = full.phase_index(full.best_phase())
    gen = full.generators(best)["query"]
    evaluated = full._generate_keywords(gen, original(full, ids), "check", seed=full.seed)
    assert served == [list(k) for k in evaluated]
    assert json.loads(json.dumps(retriever.manifest["settings"]["context"]))["query_context"] == "search_results"


@pytest.mark.slow
def test_a_run_with_the_short_system_prompt_trains_seeds_and_serves_with_it(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    data = _toy(tmp_path / "data")
    systems: set = set()
    for name in ("_query_prompts", "_item_prompts"):
        original = getattr(cogr_module.CoGR, name)

        def spy(self, ids, original=original):
            out = original(self, ids)
            systems.update(p[0]["content"] for p in out)
            return out

        monkeypatch.setattr(cogr_module.CoGR, name, spy)
    short_params = load_params(REPO_ROOT / "params.yaml", OVERRIDES + ["cogr.rounds=1", "cogr.system_prompt=short"])
    short = CoGR(tmp_path / "short", short_params, data)
    short.run()
    # the LLM seeds (G_0), SFT, GRPO rollouts and every index build: the short lines only
    assert systems == {QUERY_SYSTEM_SHORT, ITEM_SYSTEM_SHORT}

    # The knob re-keys every phase, the seeds included (G_0 writes them from item prompts).
    full = CoGR(tmp_path / "short", load_params(REPO_ROOT / "params.yaml", OVERRIDES + ["cogr.rounds=1"]), data)
    assert full.key("seed") != short.key("seed") and full.key("00_sft") != short.key("00_sft")

    from coevo.serving.search import CoGRRetriever

    retriever = CoGRRetriever.from_run(tmp_path / "short", short_params, data)
    assert retriever.manifest["settings"]["context"]["system_prompt"] == "short"
    ids = sorted(short.dataset.queries_in("test")["query_id"])
    served = retriever.generate([short.query_text[q] for q in ids])
    gen = short.generators(short.phase_index(short.best_phase()))["query"]
    evaluated = short._generate_keywords(gen, short._query_prompts(ids), "check", seed=short.seed)
    assert served == [list(k) for k in evaluated]  # serving prompts as the evaluation did
