"""Contrastive encoder training (sentence-transformers, in-batch negatives)."""

from __future__ import annotations

import numpy as np
import pytest

from coevo.config import section
from coevo.models.encoder import load_text_encoder
from coevo.train.encoder import train_encoder

# Arbitrary anchor -> positive associations the pretrained encoder does not already know.
ANCHORS = ["alpha request", "bravo request", "charlie request", "delta request", "echo request", "foxtrot request"]
POSITIVES = ["tool for bananas", "tool for volcanoes", "tool for violins", "tool for glaciers",
             "tool for tax forms", "tool for satellites"]


def _accuracy(encoder) -> float:
    a = encoder.encode(ANCHORS, normalize_embeddings=True)
    p = encoder.encode(POSITIVES, normalize_embeddings=True)
    return float(np.mean(np.argmax(a @ p.T, axis=1) == np.arange(len(ANCHORS))))


@pytest.mark.slow
def test_training_learns_the_pairs_and_saves_a_loadable_encoder(tmp_path):
    encoder = load_text_encoder("all-minilm-l6-v2")
    before = _accuracy(encoder)
    pairs = list(zip(ANCHORS, POSITIVES)) * 4
    params = section("cohyde.encoder_training", epochs=4, batch_size=6, learning_rate=5e-4)
    stats = train_encoder(encoder, pairs, params, tmp_path / "enc", seed=0)
    assert stats["pairs"] == 24 and stats["batch_size"] == 6 and stats["steps"] == 16
    assert np.isfinite(stats["train_loss"])
    after = _accuracy(encoder)
    assert after == 1.0 and after > before
    reloaded = load_text_encoder(str(tmp_path / "enc"))
    np.testing.assert_allclose(reloaded.encode(ANCHORS), encoder.encode(ANCHORS), atol=1e-5)
    assert (tmp_path / "enc" / "training.json").exists()


def test_bad_pairs_are_refused(tmp_path):
    params = section("cohyde.encoder_training")
    with pytest.raises(ValueError, match="at least 2"):
        train_encoder(None, [("a", "b")], params, tmp_path / "x", seed=0)
    with pytest.raises(ValueError, match="pair 1: expected two non-empty strings"):
        train_encoder(None, [("a", "b"), ("c", " ")], params, tmp_path / "x", seed=0)
    assert not (tmp_path / "x").exists()
