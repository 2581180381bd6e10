"""Benchmark (not a test): CoGR reward and evaluation speed on a synthetic instance.

    .venv/bin/python bench/rewards.py --items 40000 --queries 15000 --rel-per-query 1000

Builds a synthetic instance with Zipf-like keyword frequencies (Zipf-Mandelbrot,
p(rank r) ~ 1 / (r + offset)^s over a fixed vocabulary), ~10 keywords per item and ~15
per query (about half taken from the query's relevant items, the rest drawn from the
Zipf law), then measures in one run, on one core:

- item rewards/s, incremental (ItemReward, parsing included) vs naive
  (``coevo.rewards.cogr.naive_item_reward``: rebuild the item index with the candidate set
  and re-evaluate every query), and their ratio;
- query rewards/s (QueryReward, parsing included);
- one full set-metric evaluation of all queries (index build and evaluation);
- peak resident memory.

Rates are given per wall-clock second and per CPU second of this process
(time.process_time): on a shared machine the second is the one that reflects one core.

One figure per line, `name=value`; the last line is `speedup_vs_naive=<x>`.
"""

from __future__ import annotations

import os

# One core: pin BLAS/OpenMP pools before numpy loads.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from coevo.retrieval.evaluate import keyword_set_metrics  # noqa: E402
from coevo.retrieval.inverted_index import InvertedIndex  # noqa: E402
from coevo.rewards.cogr import ItemReward, QueryReward, naive_item_reward  # noqa: E402


def zipf_probabilities(vocab: int, exponent: float, offset: float) -> np.ndarray:
    weights = 1.0 / (np.arange(1, vocab + 1) + offset) ** exponent
    return weights / weights.sum()


def draw_sets(rng: np.random.Generator, p: np.ndarray, n: int, size: int, oversample: int = 2) -> list[list[int]]:
    """n keyword sets of ``size`` distinct Zipf-distributed keyword ids."""
    draws = rng.choice(len(p), size=(n, size * oversample), p=p)
    out = []
    for row in draws:
        kws = list(dict.fromkeys(row.tolist()))[:size]
        while len(kws) < size:  # rare: too many repeats among the oversampled draws
            extra = int(rng.choice(len(p), p=p))
            if extra not in kws:
                kws.append(extra)
        out.append(kws)
    return out


def build_instance(args: argparse.Namespace):
    rng = np.random.default_rng(args.seed)
    p = zipf_probabilities(args.vocab, args.zipf, args.zipf_offset)
    names = [f"kw{j}" for j in range(args.vocab)]
    item_ids = [f"i{n}" for n in range(args.items)]
    item_sets = draw_sets(rng, p, args.items, args.item_keywords)
    item_keywords = {i: [names[k] for k in s] for i, s in zip(item_ids, item_sets, strict=True)}
    query_keywords: dict[str, list[str]] = {}
    qrels: dict[str, dict[str, int]] = {}
    zipf_part = draw_sets(rng, p, args.queries, args.query_keywords - args.query_keywords // 2)
    for n in range(args.queries):
        q = f"q{n}"
        rel = rng.choice(args.items, size=args.rel_per_query, replace=False)
        qrels[q] = {item_ids[i]: 1 for i in rel}
        # Half the query's keywords come from its relevant items (as Algorithm 1 seeds them).
        from_rel = [item_sets[i][int(rng.integers(len(item_sets[i])))] for i in rel[: args.query_keywords // 2]]
        query_keywords[q] = [names[k] for k in dict.fromkeys(from_rel + zipf_part[n])]
    return rng, p, names, item_keywords, query_keywords, qrels


def perturb_all(
    rng: np.random.Generator, p: np.ndarray, names: list[str], sets: list[list[str]], n_new: int = 3
) -> list[str]:
    """Plausible sampled completions: drop ~30% of each reference set, add a few Zipf draws."""
    new = rng.choice(len(p), size=(len(sets), n_new), p=p)
    out = []
    for keywords, extra in zip(sets, new, strict=True):
        keep = [k for k, r in zip(keywords, rng.random(len(keywords)), strict=True) if r > 0.3]
        out.append(", ".join(dict.fromkeys(keep + [names[k] for k in extra])))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=40000)
    ap.add_argument("--queries", type=int, default=15000)
    ap.add_argument("--rel-per-query", type=int, default=1000)
    ap.add_argument("--item-keywords", type=int, default=10)
    ap.add_argument("--query-keywords", type=int, default=15)
    ap.add_argument("--vocab", type=int, default=50000)
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s")
    ap.add_argument("--zipf-offset", type=float, default=10.0, help="Mandelbrot offset (0 = pure Zipf)")
    ap.add_argument("--group-size", type=int, default=8, help="completions per item (GRPO group)")
    ap.add_argument("--groups-per-batch", type=int, default=64)
    ap.add_argument("--item-rewards", type=int, default=20000, help="incremental item rewards to time")
    ap.add_argument("--naive-rewards", type=int, default=3, help="naive rebuild rewards to time")
    ap.add_argument("--query-rewards", type=int, default=5000)
    ap.add_argument("--k-max", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    rng, p, names, item_keywords, query_keywords, qrels = build_instance(args)
    print(f"instance_build_s={time.perf_counter() - t0:.2f}")

    t0 = time.perf_counter()
    item_index = InvertedIndex.from_keyword_sets(item_keywords)
    index_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    metrics = keyword_set_metrics(query_keywords, item_index, qrels)
    eval_s, eval_cpu = time.perf_counter() - t0, time.process_time() - c0
    from coevo.retrieval.evaluate import relevance_matrix

    relevance = relevance_matrix(list(query_keywords), item_index, qrels)
    t0, c0 = time.perf_counter(), time.process_time()
    keyword_set_metrics(query_keywords, item_index, qrels, relevance=relevance)
    eval_cached_s, eval_cached_cpu = time.perf_counter() - t0, time.process_time() - c0
    n_ret = np.asarray([r.n_retrieved for r in metrics.per_query])
    print(f"mean_retrieved_per_query={n_ret.mean():.0f}")
    print(f"macro_f1={metrics.f1:.4f}")
    print(f"item_index_build_s={index_s:.2f}")
    print(f"full_eval_s={eval_s:.2f}")
    print(f"full_eval_with_index_build_s={index_s + eval_s:.2f}")
    print(f"full_eval_cached_qrels_s={eval_cached_s:.2f}")
    print(f"full_eval_cpu_s={eval_cpu:.2f}")
    print(f"full_eval_cached_qrels_cpu_s={eval_cached_cpu:.2f}")

    t0 = time.perf_counter()
    reward = ItemReward(query_keywords, item_keywords, qrels, k_max=args.k_max)
    print(f"item_reward_setup_s={time.perf_counter() - t0:.2f}")

    # GRPO-like batches: groups of completions for the same item.
    item_ids = list(item_keywords)
    batch = args.group_size * args.groups_per_batch
    n_batches = max(1, args.item_rewards // batch)
    batches = []
    for _ in range(n_batches):
        chosen = rng.choice(len(item_ids), size=args.groups_per_batch, replace=False)
        ids = [item_ids[i] for i in chosen for _ in range(args.group_size)]
        comps = perturb_all(rng, p, names, [item_keywords[i] for i in ids])
        batches.append((ids, comps))
    q_ref_sizes = [len(reward.reference_queries(item_ids[i])) for i in rng.choice(len(item_ids), 200, replace=False)]
    print(f"mean_q_ref_per_item={np.mean(q_ref_sizes):.0f}")
    reward._ref_cache.clear()  # time with a cold reference cache
    t0, c0 = time.perf_counter(), time.process_time()
    incremental = [reward(ids, comps) for ids, comps in batches]
    inc_s, inc_cpu = time.perf_counter() - t0, time.process_time() - c0
    inc_rate = n_batches * batch / inc_s
    print(f"item_rewards_per_s_incremental={inc_rate:.0f}")
    print(f"item_rewards_per_cpu_s_incremental={n_batches * batch / inc_cpu:.0f}")

    # Naive: the library's reference (naive_item_reward) rebuilds the item index with the
    # candidate and re-evaluates all queries; the reference per-query F1 is computed once,
    # outside the timing, to be fair to it.
    from coevo.retrieval.keywords import parse_keywords

    ref_f1 = np.asarray([r.f1 for r in metrics.per_query])
    worst_diff = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    for n in range(args.naive_rewards):
        ids, comps = batches[0]
        item, text = ids[n], comps[n]
        naive = naive_item_reward(query_keywords, item_keywords, qrels, item, parse_keywords(text).keywords,
                                  reference_f1=ref_f1)
        worst_diff = max(worst_diff, abs(naive - incremental[0][n]))
    naive_s = (time.perf_counter() - t0) / args.naive_rewards
    naive_cpu = (time.process_time() - c0) / args.naive_rewards
    print(f"item_rewards_per_s_naive={1.0 / naive_s:.4f}")
    print(f"item_rewards_per_cpu_s_naive={1.0 / naive_cpu:.4f}")
    print(f"max_abs_diff_incremental_vs_naive={worst_diff:.2e}")

    qreward = QueryReward(item_index, qrels, k_max=args.k_max)
    query_ids = list(query_keywords)
    picks = rng.choice(len(query_ids), size=args.query_rewards)
    qids = [query_ids[i] for i in picks]
    qcomps = perturb_all(rng, p, names, [query_keywords[q] for q in qids])
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(qids), batch):
        qreward(qids[start : start + batch], qcomps[start : start + batch])
    print(f"query_rewards_per_s={len(qids) / (time.perf_counter() - t0):.0f}")
    print(f"query_rewards_per_cpu_s={len(qids) / (time.process_time() - c0):.0f}")

    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak_memory_gib={peak_gib:.2f}")
    print(f"speedup_vs_naive_cpu={n_batches * batch / inc_cpu * naive_cpu:.0f}")
    print(f"speedup_vs_naive={inc_rate * naive_s:.0f}")


if __name__ == "__main__":
    main()
