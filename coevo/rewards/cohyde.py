"""CoHyDE S4: score sampled tool descriptions by NDCG@5 and mine best-vs-worst DPO pairs.

Each training query has ``num_samples`` descriptions sampled from the rewriter. A
description is scored as a query of its own: it is encoded by the current (just retrained)
encoder, the corpus index is searched, and NDCG@5 of that ranking against the query's
relevant tools is its score. The best and worst descriptions of a query form one DPO pair;
a query whose samples all score the same gives no preference signal and is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from coevo.retrieval.dense import DenseIndex

# Scores closer than this are a tie (NDCG values computed from the same formula).
TIE_TOLERANCE = 1e-9


def encode_texts(encoder: "SentenceTransformer", texts: Sequence[str], batch_size: int = 64,
                 progress: bool = False) -> np.ndarray:
    """L2-normalised float32 embeddings of ``texts``, one row per text."""
    emb = encoder.encode(list(texts), batch_size=batch_size, convert_to_numpy=True,
                         normalize_embeddings=True, show_progress_bar=progress)
    return np.asarray(emb, dtype=np.float32).reshape(len(texts), -1)


def ndcg_scores(rankings: Sequence[Sequence[str]], relevant: Sequence[Mapping[str, int]], k: int = 5) -> np.ndarray:
    """NDCG@k of each ranking against its own graded relevance map (one value per ranking)."""
    from coevo.retrieval.metrics import ranked_metrics

    if len(rankings) != len(relevant):
        raise ValueError(f"{len(rankings)} rankings for {len(relevant)} relevance maps (one each expected)")
    # One single-query call per ranking: the shared metric code defines NDCG for everyone.
    name = f"ndcg@{k}"
    return np.array([ranked_metrics({"q": list(r)}, {"q": dict(rel)}, ks=(k,))[name]
                     for r, rel in zip(rankings, relevant)], dtype=np.float64)


def score_descriptions(
    encoder: "SentenceTransformer",
    index: "DenseIndex",
    samples: Sequence[Sequence[str]],
    relevant: Sequence[Mapping[str, int]],
    k: int = 5,
    batch_size: int = 64,
) -> np.ndarray:
    """NDCG@k of every sampled description: an array (queries x samples).

    ``samples[q]`` are the descriptions sampled for query q, ``relevant[q]`` its
    ``{item_id: grade}`` map. Each text is encoded as given: the caller passes what inference
    encodes (``coevo.methods.cohyde.searched_text``: the description, or the query followed by it).
    """
    if len(samples) != len(relevant):
        raise ValueError(f"{len(samples)} sample groups for {len(relevant)} queries (one each expected)")
    widths = {len(group) for group in samples}
    if len(widths) > 1:
        raise ValueError(f"every query needs the same number of samples, got sizes {sorted(widths)}")
    if not samples:
        return np.zeros((0, 0))
    width = widths.pop()
    flat = [text for group in samples for text in group]
    ranked = index.rank_corpus(encode_texts(encoder, flat, batch_size=batch_size), k)
    flat_relevant = [rel for rel in relevant for _ in range(width)]
    return ndcg_scores(ranked, flat_relevant, k).reshape(len(samples), width)


def mine_dpo_pairs(
    prompts: Sequence[str],
    samples: Sequence[Sequence[str]],
    scores: Sequence[Sequence[float]] | np.ndarray,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Best-vs-worst preference pairs, one per query whose sample scores do not all tie.

    Returns ``(pairs, stats)``: each pair is ``{prompt, chosen, rejected, chosen_score,
    rejected_score}`` (the first best and the first worst sample win ties); stats hold
    ``queries``, ``pairs``, ``ties_dropped``, ``empty_samples``, ``empty_dropped`` (queries left
    without two non-empty samples), ``mean_score_gap`` (best - worst, over kept pairs; 0 when
    none), ``mean_best`` and ``mean_score`` (over all samples).

    An empty sample is not a description: it can score well (encoding the query with an empty
    description is encoding the query), but DPO cannot prefer or reject nothing, so best and
    worst are chosen among the non-empty samples, and a query with fewer than two gives no pair.
    """
    if not (len(prompts) == len(samples) == len(scores)):
        raise ValueError(f"prompts ({len(prompts)}), samples ({len(samples)}) and scores ({len(scores)}) "
                         "must have one entry per query")
    pairs: list[dict[str, Any]] = []
    ties = empty = short = 0
    gaps: list[float] = []
    all_scores: list[float] = []
    best_scores: list[float] = []
    for q, (prompt, texts, values) in enumerate(zip(prompts, samples, scores)):
        values = np.asarray(values, dtype=np.float64)
        if len(texts) != len(values) or len(texts) < 2:
            raise ValueError(f"query {q}: {len(texts)} samples and {len(values)} scores (need >= 2 of each, equal)")
        if not np.isfinite(values).all():
            raise ValueError(f"query {q}: scores hold NaN or infinite values: {values.tolist()}")
        all_scores.extend(values.tolist())
        best_scores.append(float(values.max()))
        written = [i for i, text in enumerate(texts) if text.strip()]
        empty += len(texts) - len(written)
        if len(written) < 2:
            short += 1
            continue
        best = written[int(np.argmax(values[written]))]
        worst = written[int(np.argmin(values[written]))]
        gap = float(values[best] - values[worst])
        if gap <= TIE_TOLERANCE:
            ties += 1
            continue
        pairs.append({"prompt": prompt, "chosen": texts[best], "rejected": texts[worst],
                      "chosen_score": float(values[best]), "rejected_score": float(values[worst])})
        gaps.append(gap)
    stats = {
        "queries": len(prompts),
        "pairs": len(pairs),
        "ties_dropped": ties,
        "empty_samples": empty,
        "empty_dropped": short,
        "mean_score_gap": float(np.mean(gaps)) if gaps else 0.0,
        "mean_best": float(np.mean(best_scores)) if best_scores else 0.0,
        "mean_score": float(np.mean(all_scores)) if all_scores else 0.0,
    }
    return pairs, stats
