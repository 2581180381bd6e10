"""GRAPE rewards: rank formula, several relevant items, malformed rewrites, similarity and reciprocal-rank ablations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from coevo.retrieval.dense import FrozenRetriever
from coevo.rewards.grape import (
    RankReward,
    ReciprocalRankReward,
    RewriteParser,
    SimilarityReward,
    make_reward,
    rank_reward,
    reciprocal_rank_reward,
)


class BagOfLettersRetriever(FrozenRetriever):
    """Deterministic toy encoder: letter counts a..z (so tests know every score)."""

    kind, name = "letters", "a-z"

    @staticmethod
    def _vec(text: str) -> np.ndarray:
        v = np.zeros(26, np.float32)
        for ch in text.lower():
            if "a" <= ch <= "z":
                v[ord(ch) - 97] += 1
        return v

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._vec(t) for t in texts])

    def embed_items(self, items: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return np.stack([self._vec(it["title"]) for it in items])


@pytest.fixture
def retriever() -> BagOfLettersRetriever:
    r = BagOfLettersRetriever()
    r.index_corpus([{"item_id": c, "title": c * 3} for c in "abcde"])
    return r


def test_rank_reward_formula():
    assert rank_reward(1, 10) == 1.0
    assert rank_reward(10, 10) == -1.0
    assert rank_reward(4, 7) == pytest.approx(0.0)
    np.testing.assert_allclose(rank_reward(np.array([1, 2, 3]), 3), [1.0, 0.0, -1.0])
    assert rank_reward(1, 1) == 1.0
    with pytest.raises(ValueError):
        rank_reward(0, 5)
    with pytest.raises(ValueError):
        rank_reward(6, 5)


def test_rank_reward_uses_exact_corpus_rank(retriever):
    reward = RankReward(retriever, {"q1": ["a"], "q2": ["e"]})
    # "aaa" puts a first, "eeee" puts e first (reward 1.0 each)
    values = reward(["q1", "q2", "q1"], ["aaa", "eeee", "b"])
    assert values[0] == 1.0 and values[1] == 1.0
    # for "b": item b scores 1, the rest 0 and tie -> a has rank 2 -> 1 - 2*1/4 = 0.5
    assert values[2] == pytest.approx(0.5)


def test_reciprocal_rank_reward_separates_the_top_places(retriever):
    assert reciprocal_rank_reward(1, 5) == 1.0
    np.testing.assert_allclose(reciprocal_rank_reward(np.array([1, 2, 4]), 5), [1.0, 0.5, 0.25])
    with pytest.raises(ValueError, match="1..5"):
        reciprocal_rank_reward(6, 5)
    reward = make_reward("reciprocal_rank", retriever, {"q": ["a", "c"]})
    assert isinstance(reward, ReciprocalRankReward)
    # "aaab": a first (1), c ties with d, e behind a and b at rank 3 (1/3): the mean of the two
    assert reward(["q"], ["aaab"]) == [pytest.approx((1 + 1 / 3) / 2)]
    # "aaa": a first; "b": a ties behind b at rank 2; a blank rewrite is malformed
    assert make_reward("reciprocal_rank", retriever, {"q": ["a"]})(["q", "q", "q"], ["aaa", "b", " "]) == [
        1.0, pytest.approx(0.5), -1.0]
    # the linear reward gives the second place 0.5 on this 5-item corpus, 1 / rank the same;
    # on 199 items the tenth place earns 0.91 against 0.1
    assert rank_reward(10, 199) == pytest.approx(0.909, abs=1e-3) and reciprocal_rank_reward(10, 199) == 0.1


def test_several_relevant_items_average(retriever):
    reward = RankReward(retriever, {"q": ["a", "c"]})
    # "aaab": a rank 1 (1.0); c ties with d, e at 0 behind a and b -> rank 3 -> 0.0; mean 0.5
    assert reward(["q"], ["aaab"]) == [pytest.approx(0.5)]


def test_malformed_rewrites_get_minimum(retriever):
    reward = RankReward(retriever, {"q": ["a"]})
    assert reward(["q", "q", "q"], ["", "   \n ", [{"role": "assistant", "content": "aaa"}]]) == [-1.0, -1.0, 1.0]
    assert reward.last_stats["malformed_fraction"] == pytest.approx(2 / 3)
    with pytest.raises(KeyError, match="no qrels"):
        reward(["other"], ["aaa"])
    with pytest.raises(ValueError, match="no relevant item"):
        RankReward(retriever, {"q": []})


def test_reasoning_parser_caps_length():
    parser = RewriteParser(reasoning=True, max_reasoning_tokens=5)
    assert parser("Reasoning: short thought here\nRewrite: weather tomorrow") == "weather tomorrow"
    assert parser("just a query without marker") is None
    assert parser("Reasoning: " + "word " * 6 + "\nRewrite: x") is None
    assert parser("Reasoning: ok\nRewrite:   ") is None
    plain = RewriteParser()
    assert plain('Rewritten query: "find cheap flights"\nextra') == "find cheap flights"


def test_parser_reads_conversational_completions_like_the_other_rewards():
    parser = RewriteParser()
    turns = [{"role": "assistant", "content": "draft"}, {"role": "tool", "content": "tool output"},
             {"role": "assistant", "content": "Rewrite: cheap flights"}]
    assert parser(turns) == "cheap flights"  # the final assistant turn, never the tool's text
    assert parser([{"role": "tool", "content": "tool output"}]) is None  # no assistant turn: malformed
    assert parser([]) is None
    with pytest.raises(TypeError, match="completion"):  # a wiring mistake, not a malformed rewrite
        parser(None)


def test_similarity_reward_is_the_cosine(retriever):
    reward = SimilarityReward(retriever, {"q": ["a"]})
    values = reward(["q", "q"], ["aaa", "ab"])
    assert values[0] == pytest.approx(1.0)
    assert values[1] == pytest.approx(1 / np.sqrt(2), abs=1e-6)
    assert isinstance(make_reward("rank", retriever, {"q": ["a"]}), RankReward)
    with pytest.raises(ValueError, match="unknown reward 'bleu' .expected one of rank, reciprocal_rank, similarity"):
        make_reward("bleu", retriever, {"q": ["a"]})


def test_expand_mode_scores_the_query_followed_by_the_rewrite(retriever):
    texts = {"qa": "bb", "qb": "bb"}
    reward = make_reward("rank", retriever, {"qa": ["a"], "qb": ["b"]}, query_texts=texts)
    # "bb aaa" ranks a first (3 a's beat 2 b's); "bb a" keeps the query's b first
    assert reward(["qa", "qb"], ["aaa", "a"]) == [1.0, 1.0]
    # replace mode searches "a" alone: b ties at 0 behind a, rank 2 -> 1 - 2 * 1 / 4
    assert RankReward(retriever, {"qb": ["b"]})(["qb"], ["a"]) == [pytest.approx(0.5)]
    # a malformed expansion is still a format error: minimum reward, as in replace mode
    assert reward(["qb"], ["  "]) == [-1.0]
    with pytest.raises(KeyError, match="no query text for query id 'qc'"):
        make_reward("rank", retriever, {"qc": ["a"]}, query_texts=texts)


def test_searched_text_per_mode():
    from coevo.rewards.grape import searched_text

    assert searched_text("cheap flights", "airline fares", "replace") == "airline fares"
    assert searched_text("cheap flights", None, "replace") == ""
    assert searched_text("cheap flights", "airline fares", "expand") == "cheap flights airline fares"
    assert searched_text("cheap flights", None, "expand") == "cheap flights"
    assert searched_text("cheap flights", "airline fares", "mix") == "cheap flights airline fares"  # shown words
    with pytest.raises(ValueError, match="grape.query_mode"):
        searched_text("q", "r", "append")


def test_mix_mode_searches_the_query_embedding_plus_the_weighted_rewrite_embedding(retriever):
    from coevo.rewards.grape import search_embeddings

    a, b = np.eye(26, dtype=np.float32)[0], np.eye(26, dtype=np.float32)[1]
    embs = search_embeddings(retriever.embed_queries, ["bb", "bb"], ["aaa", None], "mix", 0.5)
    np.testing.assert_allclose(embs, [b + 0.5 * a, b])  # unit embeddings; a malformed rewrite: the query alone
    texts = {"qa": "bb", "qb": "bb"}
    reward = make_reward("rank", retriever, {"qa": ["a"], "qb": ["b"]}, query_texts=texts, query_mode="mix",
                         mix_weight=0.5)
    # the query keeps the larger part: b still first, a second (1 - 2 * 1 / 4), where expand's
    # "bb aaa" would rank a first; a malformed rewrite is a format error, as in the other modes
    assert reward(["qa", "qb", "qb"], ["aaa", "aaa", " "]) == [pytest.approx(0.5), 1.0, -1.0]
    # the weight decides: query "bbb a" (a 0.32, b 0.95) plus the rewrite "a" at 0.5 keeps b first, at 1.0 not
    for weight, expected in ((0.5, 0.5), (1.0, 1.0)):
        mixed = make_reward("rank", retriever, {"q": ["a"]}, query_texts={"q": "bbb a"}, query_mode="mix",
                            mix_weight=weight)
        assert mixed(["q"], ["a"]) == [pytest.approx(expected)]
    with pytest.raises(ValueError, match="grape.mix_weight must be > 0 in mix mode"):
        search_embeddings(retriever.embed_queries, ["bb"], ["a"], "mix", 0.0)
    with pytest.raises(ValueError, match="query texts are needed with expand and mix"):
        make_reward("rank", retriever, {"qa": ["a"]}, query_mode="mix", mix_weight=0.5)
