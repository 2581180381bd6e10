"""Exact corpus rank for the GRAPE reward: rewards/s, vectorised vs a naive full sort.

Synthetic corpora of 10k and 100k random 384-d items (MiniLM's dimension), CPU. For each
query the reward needs the rank of its relevant item among all N items:

- baseline: score the corpus, argsort the full score vector, find the item's position
  (what a per-rollout "rank the whole corpus" implementation does);
- candidate: ``DenseIndex.exact_ranks``: one matrix product per query block, then count
  the items scoring strictly above the relevant one (no sort).

Both run in the same process on the same queries (so machine load cancels in the ratio)
and must agree on every rank. Usage: ``python bench/rank_reward.py [--queries 64]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from coevo.retrieval.dense import DenseIndex, l2_normalize
from coevo.rewards.grape import rank_reward


def naive_ranks(index: DenseIndex, queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    items = index.embeddings
    out = np.empty(len(rows), dtype=np.int64)
    for i, (q, row) in enumerate(zip(l2_normalize(queries), rows)):
        scores = items @ q
        order = np.argsort(-scores, kind="stable")
        pos = int(np.flatnonzero(order == row)[0])
        # optimistic ties, as in exact_ranks: move up past items with the same score
        while pos > 0 and scores[order[pos - 1]] == scores[row]:
            pos -= 1
        out[i] = pos + 1
    return out


def check_agreement(index: DenseIndex, queries: np.ndarray, rows: np.ndarray, fast: np.ndarray,
                    slow: np.ndarray, n: int) -> None:
    """Ranks must agree up to float rounding: matvec and matmul round differently in the last
    bit, so an item within 1e-5 of the relevant score may fall on either side."""
    q = l2_normalize(queries)
    for i in np.flatnonzero(fast != slow):
        scores = index.embeddings @ q[i]
        near = np.count_nonzero(np.abs(scores - scores[rows[i]]) < 1e-5) - 1
        if abs(int(fast[i]) - int(slow[i])) > near:
            raise SystemExit(f"N={n}: exact_ranks {fast[i]} vs full sort {slow[i]} for query {i}")


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=64, help="rewards per measurement (one GRPO batch or more)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="corpus sizes")
    parser.add_argument("--dim", type=int, default=384, help="embedding dimension")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    ratios = []
    for n in args.sizes:
        index = DenseIndex.build([str(i) for i in range(n)], rng.normal(size=(n, args.dim)).astype(np.float32))
        rows = rng.integers(0, n, size=args.queries)
        # queries = relevant item * strength + random direction: ranks spread over the corpus
        strength = np.linspace(0.0, 0.25, args.queries, dtype=np.float32)[:, None]
        noise = l2_normalize(rng.normal(size=(args.queries, args.dim)))
        queries = strength * index.embeddings[rows] + noise
        fast, slow = index.exact_ranks(queries, rows), naive_ranks(index, queries, rows)
        check_agreement(index, queries, rows, fast, slow, n)
        rewards = rank_reward(fast, n)
        t_fast = best_time(lambda: index.exact_ranks(queries, rows), args.repeats)
        t_slow = best_time(lambda: naive_ranks(index, queries, rows), args.repeats)
        ratio = t_slow / t_fast
        ratios.append(ratio)
        print(f"N={n:>7,} d={args.dim}: exact_ranks {args.queries / t_fast:>10,.0f} rewards/s | "
              f"full sort {args.queries / t_slow:>8,.0f} rewards/s | speed-up x{ratio:.1f} "
              f"(mean reward {rewards.mean():+.3f})")
    print("ratio (full sort time / exact_ranks time): " + ", ".join(
        f"N={n:,}: x{r:.1f}" for n, r in zip(args.sizes, ratios)))


if __name__ == "__main__":
    main()
