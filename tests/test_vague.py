"""coevo.data.vague: the vague-query rule, and the two ways a prepared data set applies it."""

from __future__ import annotations

import pandas as pd
import pytest

from coevo.config import load_params
from coevo.data.schema import Dataset
from coevo.data.vague import item_vocabulary, vague_text, with_vague, words


def _dataset() -> Dataset:
    items = pd.DataFrame({"item_id": ["weather", "calc"], "title": ["WeatherPlugin", "calculator"],
                          "text": ["Forecasts for any city.", "Executes a formula and returns a result."]})
    queries = pd.DataFrame({
        "query_id": ["q1", "q2", "q3", "q4"],
        "text": ["What is the weather forecast in Paris?", "Can you calculate 2 + 2 for me?",
                 "Weather forecasts", "Will it rain in Oslo tomorrow?"],
        "split": ["train", "test", "test", "test"],
    })
    qrels = pd.DataFrame({"query_id": ["q1", "q2", "q3", "q4"], "item_id": ["weather", "calc", "weather", "weather"],
                          "grade": [1, 1, 1, 1]})
    return Dataset(items=items, queries=queries, qrels=qrels, name="toy")


def test_words_split_camel_case_and_lower_case():
    assert words("WeatherPlugin, HTTPServer v2") == ["weather", "plugin", "http", "server", "v", "2"]


def test_the_items_words_and_their_stems_leave_the_query_and_stopwords_stay():
    vocab = item_vocabulary(["WeatherPlugin Forecasts for any city."])
    assert {"weather", "weath", "forecasts", "forec", "city"} <= vocab and "for" not in vocab
    assert vague_text("What is the weather forecast in Paris?", vocab) == "What is the in Paris?"
    # "calculate" shares the stem "calcu" with "calculator"; the question around it is kept.
    assert vague_text("Can you calculate 2 + 2 for me?", item_vocabulary(["calculator"])) == "Can you 2 + 2 for me?"
    # Nothing but the item's words and stopwords: no vague version.
    assert vague_text("Weather forecasts for me", vocab) is None


def test_test_copy_adds_a_vague_split_with_the_same_qrels():
    vague = with_vague(_dataset(), "test_copy")
    copies = vague.queries[vague.queries["split"] == "vague"]
    assert list(copies["query_id"]) == ["q2~vague", "q4~vague"]  # q3 has no content word left
    assert list(copies["text"]) == ["Can you 2 + 2 for me?", "Will it rain in Oslo tomorrow?"]
    assert vague.relevant("vague") == {"q2~vague": {"calc": 1}, "q4~vague": {"weather": 1}}
    assert vague.relevant("test") == _dataset().relevant("test")  # the standard test set is untouched
    assert vague.meta["vague"] == {"mode": "test_copy", "queries": 3, "kept": 2, "dropped": 1,
                                   "rule": "item vocabulary removed (stem 5)"}


def test_all_queries_makes_every_split_vague_and_drops_what_is_left_empty():
    vague = with_vague(_dataset(), "all_queries")
    assert dict(zip(vague.queries["query_id"], vague.queries["text"])) == {
        "q1": "What is the in Paris?", "q2": "Can you 2 + 2 for me?", "q4": "Will it rain in Oslo tomorrow?"}
    assert set(vague.qrels["query_id"]) == {"q1", "q2", "q4"}
    assert vague.meta["vague"]["kept_per_split"] == {"test": 2, "train": 1}
    assert with_vague(_dataset(), "none") is not None and with_vague(_dataset(), "none").queries.equals(
        _dataset().queries)


def test_a_bad_mode_and_a_vague_split_without_copies_are_refused():
    with pytest.raises(ValueError, match=r"data.vague: 'some' is not one of none \| test_copy \| train_copy \| all_queries"):
        with_vague(_dataset(), "some")
    with pytest.raises(ValueError, match="evaluation.split = vague needs data.vague = test_copy"):
        load_params(["params.yaml"], ["evaluation.split=vague"])
    assert load_params(["params.yaml"], ["evaluation.split=vague", "data.vague=test_copy"]).evaluation.split == "vague"


def test_train_copy_adds_vague_copies_to_train_and_val_and_the_vague_split():
    base = _dataset()
    base.queries.loc[base.queries["query_id"] == "q4", "split"] = "val"
    vague = with_vague(base, "train_copy")
    by_split = {s: sorted(g["query_id"]) for s, g in vague.queries.groupby("split")}
    assert by_split == {"train": ["q1", "q1~vague"], "val": ["q4", "q4~vague"], "test": ["q2", "q3"],
                        "vague": ["q2~vague"]}
    assert vague.relevant("train")["q1~vague"] == {"weather": 1}
    assert dict(zip(vague.queries["query_id"], vague.queries["text"]))["q1~vague"] == "What is the in Paris?"
    assert vague.relevant("test") == base.relevant("test")  # the standard test set is untouched
    assert vague.meta["vague"] == {"mode": "train_copy", "queries": 2, "kept": 1, "dropped": 1,
                                   "copies_per_split": {"train": 1, "val": 1},
                                   "rule": "item vocabulary removed (stem 5)"}
    assert load_params(["params.yaml"], ["evaluation.split=vague", "data.vague=train_copy"]).data.vague == "train_copy"


def test_the_prepared_loader_leaves_every_vague_copy_out(tmp_path):
    from coevo.data.loaders import load_prepared

    with_vague(_dataset(), "train_copy").save(tmp_path / "prepared")
    loaded = load_prepared(tmp_path / "prepared")
    assert sorted(loaded.queries["query_id"]) == ["q1", "q2", "q3", "q4"]
    assert set(loaded.qrels["query_id"]) == {"q1", "q2", "q3", "q4"}
