"""Dense faiss index: exact whole-corpus ranks (vs brute force, ties), search, save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coevo.retrieval.dense import DenseIndex, l2_normalize


def _brute_ranks(queries: np.ndarray, items: np.ndarray, rows: np.ndarray) -> np.ndarray:
    q, x = l2_normalize(queries), l2_normalize(items)
    out = []
    for qi, row in zip(q, rows):
        scores = x @ qi
        order = sorted(range(len(x)), key=lambda j: -scores[j])
        # optimistic ties: first position holding the relevant item's score
        out.append(1 + next(p for p, j in enumerate(order) if scores[j] >= scores[row] and scores[j] <= scores[row]))
    return np.array(out)


@pytest.fixture
def corpus():
    rng = np.random.default_rng(0)
    return [f"item{i}" for i in range(300)], rng.normal(size=(300, 16)).astype(np.float32)


def test_exact_ranks_match_brute_force(corpus):
    ids, emb = corpus
    index = DenseIndex.build(ids, emb)
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(40, 16)).astype(np.float32)
    rows = rng.integers(0, len(ids), size=40)
    ranks = index.exact_ranks(queries, rows)
    np.testing.assert_array_equal(ranks, _brute_ranks(queries, emb, rows))
    assert ranks.min() >= 1 and ranks.max() <= len(ids)


def test_exact_ranks_agree_with_full_ranking(corpus):
    ids, emb = corpus
    index = DenseIndex.build(ids, emb)
    queries = np.random.default_rng(2).normal(size=(5, 16)).astype(np.float32)
    rankings = index.rank_corpus(queries)
    assert all(len(r) == len(ids) for r in rankings)
    for qi, ranking in enumerate(rankings):
        # the item at position p of the faiss ranking has exact rank p + 1 (no ties here)
        for pos in (0, 7, 150, len(ids) - 1):
            assert index.exact_ranks(queries[qi], index.rows([ranking[pos]]))[0] == pos + 1


def test_block_processing_matches_single_block(corpus, monkeypatch):
    import coevo.retrieval.dense as dense

    ids, emb = corpus
    index = DenseIndex.build(ids, emb)
    queries = np.random.default_rng(3).normal(size=(25, 16)).astype(np.float32)
    rows = np.arange(25)
    whole = index.exact_ranks(queries, rows)
    monkeypatch.setattr(dense, "_MAX_BLOCK_CELLS", len(ids) * 3)  # 3 queries per block
    np.testing.assert_array_equal(index.exact_ranks(queries, rows), whole)


def test_ties_rank_optimistically():
    emb = np.array([[1, 0], [1, 0], [0, 1], [1, 0], [-1, 0]], dtype=np.float32)
    index = DenseIndex.build(["a", "b", "c", "d", "e"], emb)
    q = np.array([[1, 0]] * 5, dtype=np.float32)
    # a, b, d tie at the top: each gets rank 1; c is next (score 0); e last
    np.testing.assert_array_equal(index.exact_ranks(q, np.arange(5)), [1, 1, 4, 1, 5])


def test_search_and_pair_scores(corpus):
    ids, emb = corpus
    index = DenseIndex.build(ids, emb, encoder="test")
    top, scores = index.search(emb[10], 3)
    assert top[0] == "item10" and scores[0] == pytest.approx(1.0, abs=1e-5)
    assert list(scores) == sorted(scores, reverse=True)
    batch_ids, batch_scores = index.search(emb[:4], 2)
    assert [r[0] for r in batch_ids] == ids[:4] and batch_scores.shape == (4, 2)
    np.testing.assert_allclose(index.pair_scores(emb[:4], np.arange(4)), 1.0, atol=1e-5)


def test_save_load_round_trip(corpus, tmp_path):
    ids, emb = corpus
    index = DenseIndex.build(ids, emb, encoder="text:all-minilm-l6-v2")
    path = index.save(tmp_path / "idx")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["n_items"] == 300 and manifest["dim"] == 16 and manifest["encoder"] == "text:all-minilm-l6-v2"
    assert not list(tmp_path.glob(".*tmp"))  # the atomic temp folder is gone
    loaded = DenseIndex.load(path)
    assert loaded.ids == ids and loaded.encoder == index.encoder
    np.testing.assert_array_equal(loaded.embeddings, index.embeddings)
    q = np.random.default_rng(4).normal(size=(6, 16)).astype(np.float32)
    np.testing.assert_array_equal(loaded.exact_ranks(q, np.arange(6)), index.exact_ranks(q, np.arange(6)))
    assert loaded.manifest()["content_hash"] == manifest["content_hash"]


def test_load_detects_tampering(corpus, tmp_path):
    ids, emb = corpus
    path = DenseIndex.build(ids, emb).save(tmp_path / "idx")
    (path / "ids.json").write_text(json.dumps(list(reversed(ids))))
    with pytest.raises(ValueError, match="content hash"):
        DenseIndex.load(path)
    with pytest.raises(FileNotFoundError, match="not a dense index folder"):
        DenseIndex.load(tmp_path)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="appears twice"):
        DenseIndex.build(["a", "a"], np.eye(2))
    with pytest.raises(ValueError, match="row 1"):
        DenseIndex.build(["a", "b"], np.array([[1.0, 0.0], [np.nan, 1.0]]))
    index = DenseIndex.build(["a", "b"], np.eye(2))
    with pytest.raises(ValueError, match="dimension 3"):
        index.exact_ranks(np.ones((1, 3)), [0])
    with pytest.raises(KeyError, match="'zz'"):
        index.rows(["zz"])


def test_rank_corpus_cuts_at_k_and_at_the_corpus_size(corpus):
    # The dense baseline asks for the top 1000 whatever the corpus size.
    ids, emb = corpus
    index = DenseIndex.build(ids, emb)
    queries = np.random.default_rng(5).normal(size=(3, 16)).astype(np.float32)
    assert [len(r) for r in index.rank_corpus(queries, k=1000)] == [300] * 3
    top = index.rank_corpus(queries, k=10)
    assert [len(r) for r in top] == [10] * 3
    assert all(r[:10] == full[:10] for r, full in zip(top, index.rank_corpus(queries)))
