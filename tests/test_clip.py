"""open_clip retriever: tiny random CLIP end to end on the Flickr8k-CN images (read in place);
the error checks need no data and run without ../shared/data."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from coevo.models.clip import TINY_CLIP, ClipRetriever
from coevo.retrieval.dense import DenseIndex
from coevo.rewards.grape import RankReward, RewriteParser
from tests.conftest import shared_data

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def flickr():
    root = shared_data("flickr8k_cn_1k")
    with open(root / "captions.tsv", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["lang"] == "zh" and r["idx"] == "0"]
    rows = sorted(rows, key=lambda r: r["image"])[:40]
    items = [{"item_id": r["image"], "image_path": r["image"]} for r in rows]
    captions = [r["caption"] for r in rows]
    return root, items, captions


def test_tiny_clip_end_to_end(flickr, tmp_path):
    root, items, captions = flickr
    retriever = ClipRetriever(TINY_CLIP, image_root=root / "images", seed=0)
    index = retriever.index_corpus(items)
    assert index.embeddings.shape == (40, 32)
    np.testing.assert_allclose(np.linalg.norm(index.embeddings, axis=1), 1.0, atol=1e-5)
    q = retriever.embed_queries(captions[:5])
    assert q.shape == (5, 32) and np.isfinite(q).all()

    ids = [it["item_id"] for it in items]
    ranks = retriever.ranks(captions, ids)
    assert ranks.min() >= 1 and ranks.max() <= 40
    reward = RankReward(retriever, {f"q{i}": [ids[i]] for i in range(40)}, RewriteParser())
    values = reward([f"q{i}" for i in range(40)] + ["q0"], captions + [""])
    assert all(-1.0 <= v <= 1.0 for v in values) and values[-1] == -1.0
    np.testing.assert_allclose(values[:40], 1 - 2 * (ranks - 1) / 39)

    # faiss round trip: same ranks from the reloaded index
    loaded = DenseIndex.load(index.save(tmp_path / "clip_idx"))
    retriever.attach(loaded)
    np.testing.assert_array_equal(retriever.ranks(captions, ids), ranks)


def test_local_checkpoint_reproduces_the_model(flickr, tmp_path):
    import torch

    root, items, captions = flickr
    first = ClipRetriever(TINY_CLIP, image_root=root / "images", seed=1)
    ckpt = tmp_path / "tiny_clip.pt"
    torch.save(first.model.state_dict(), ckpt)
    second = ClipRetriever(TINY_CLIP, pretrained=str(ckpt), image_root=root / "images", seed=99)
    np.testing.assert_allclose(second.embed_items(items[:4]), first.embed_items(items[:4]), atol=1e-6)
    np.testing.assert_allclose(second.embed_queries(captions[:4]), first.embed_queries(captions[:4]), atol=1e-6)


def test_missing_image_and_unknown_model_are_named(tmp_path):
    """Error checks need no data: a missing image, an unknown architecture, a missing checkpoint."""
    retriever = ClipRetriever(TINY_CLIP, image_root=tmp_path)
    items = [{"item_id": "1001_missing.jpg", "image_path": "1001_missing.jpg"}]
    with pytest.raises(FileNotFoundError, match="1001_missing.jpg"):
        retriever.embed_items(items)
    with pytest.raises(ValueError, match="not an open_clip architecture"):
        ClipRetriever("No-Such-CLIP")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ClipRetriever(TINY_CLIP, pretrained=str(tmp_path / "missing.pt"))
