"""Benchmark one CoHyDE round on CPU: time and peak memory of its sub-phases S2, S3, S4 (sampling,
scoring, mining) and DPO, each run by the method's own phase runner.

Also measures dense search throughput: the faiss flat inner-product index against a
brute-force numpy search (matrix product + top-k selection) on the same vectors, printed
as a ratio. Both run single-threaded in the same process, interleaved, best of ``--repeats``,
so machine load cancels in the ratio.

    .venv/bin/python bench/cohyde_round.py --dataset data/processed/stabletoolbench_sample \
        --generators tiny smollm2-135m --queries 8

S1a and S1b run first (not timed) because a round starts from their checkpoints. The last
line is ``faiss_vs_numpy=<x>``: numpy search time over faiss search time at the last
``--search-items`` size.
"""

from __future__ import annotations

import os

# One thread everywhere (BLAS, OpenMP, torch) before numpy/torch load: a shared machine, and
# a fair faiss-vs-numpy comparison.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
# A random `tiny` rewriter writes text only after a real warm-up (as in the CI test): full
# fine-tuning at a high learning rate; with LoRA at 2e-4 its greedy outputs stay empty.
TINY_OVERRIDES = ("cohyde.lora.enabled=false", "cohyde.warmup.learning_rate=3e-3", "cohyde.warmup.epochs=2",
                  "cohyde.warmup.batch_size=16", "cohyde.warmup_formats_per_item=5", "cohyde.warmup_max_examples=null",
                  "cohyde.dpo.learning_rate=1e-3")


class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled every 10 ms)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.process = psutil.Process()
        self.peak = 0
        self.start = 0
        self._stop = threading.Event()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self.start = self.process.memory_info().rss
        self.peak = self.start
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def measure(fn: Callable[[], Any]) -> tuple[float, float, float]:
    """(seconds, peak RSS MiB, peak growth over the start MiB) of one call."""
    with PeakRSS() as mem:
        started = time.perf_counter()
        fn()
        seconds = time.perf_counter() - started
    mib = 1024 * 1024
    return seconds, mem.peak / mib, (mem.peak - mem.start) / mib


def bench_round(generator: str, dataset: Path, queries: int, max_new_tokens: int, params_path: Path,
                warmup_examples: int) -> list[dict[str, Any]]:
    import torch

    from coevo.config import load_params
    from coevo.io import read_json
    from coevo.methods.cohyde import CoHyDE, sub_phase

    torch.set_num_threads(1)
    params = load_params(params_path, [
        f"cohyde.generator={generator}", f"cohyde.max_train_queries={queries}",
        f"cohyde.max_new_tokens={max_new_tokens}", "cohyde.warmup_formats_per_item=1",
        f"cohyde.warmup_max_examples={warmup_examples}", "cohyde.rounds=1", "seed=0",
        *(TINY_OVERRIDES if generator == "tiny" else ()),
    ])
    cfg = params.cohyde
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"cohyde-bench-{generator}-") as folder:
        run = CoHyDE(folder, params, dataset)
        # The phases a round reads (untimed): S1a, S1b and vanilla HyDE, through the method's own runner.
        for phase in ("s1a", "s1b", "hyde"):
            run.run_phase(phase)
        for stage, fn in (
            ("S2 generate", lambda: run.run_phase(sub_phase(1, "s2"))),
            ("S3 encoder + index", lambda: run.run_phase(sub_phase(1, "s3"))),
            ("S4 sample + score", lambda: run.run_phase(sub_phase(1, "s4"))),
            ("DPO", lambda: run.dpo(1)),  # the round phase's training, without its val evaluation
        ):
            seconds, peak, growth = measure(fn)
            rows.append({"generator": generator, "stage": stage, "seconds": seconds, "peak_mib": peak,
                         "growth_mib": growth})
            if stage.startswith("S3"):
                train = run.result(sub_phase(1, "s3"))["encoder"]["seconds"]
                rows.append({"generator": generator, "stage": "  of which training", "seconds": train,
                             "peak_mib": float("nan"), "growth_mib": float("nan")})
        pairs = run.result(sub_phase(1, "s4"))["mining"]["pairs"]
        if pairs == 0:
            # Every query's samples tied (a noise-writing `tiny` scores 0 everywhere), so the round
            # skipped DPO. Time DPO anyway on first-vs-last sample pairs: its cost depends on the
            # lengths, not on which sample won. Labelled as such in the table.
            from coevo.methods.cohyde import rewriter_messages
            from coevo.train.dpo import train_dpo

            generator = run.rewriter("s1b")
            samples = read_json(Path(folder) / "round_1" / "s4_samples.json")["samples"]
            timing_pairs = [
                {"prompt": generator.render(rewriter_messages(q["text"])), "chosen": s[0], "rejected": s[-1]}
                for q, s in zip(run.train_queries(), samples) if s[0] != s[-1]
            ]
            if timing_pairs:
                seconds, peak, growth = measure(lambda: train_dpo(generator, timing_pairs, cfg.dpo, cfg.dpo_beta,
                                                                  Path(folder) / "timing_dpo", seed=0))
                rows.append({"generator": generator.name, "stage": "DPO (timing pairs)", "seconds": seconds,
                             "peak_mib": peak, "growth_mib": growth})
                pairs = len(timing_pairs)
    for row in rows:
        row["queries"] = len(run.train_queries())
        row["pairs"] = pairs
    return rows


def bench_search(n_items: int, n_queries: int, dim: int, k: int, repeats: int, seed: int = 0) -> dict[str, float]:
    """Queries per second of faiss IndexFlatIP and of numpy (matmul + argpartition) on the same vectors."""
    import faiss

    from coevo.retrieval.dense import DenseIndex, l2_normalize

    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(seed)
    items = l2_normalize(rng.standard_normal((n_items, dim)).astype(np.float32))
    queries = l2_normalize(rng.standard_normal((n_queries, dim)).astype(np.float32))
    index = DenseIndex.build([str(i) for i in range(n_items)], items)
    stored = np.array(index.embeddings)

    def numpy_search() -> np.ndarray:
        scores = queries @ stored.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        return np.take_along_axis(top, order, axis=1)

    def faiss_search() -> np.ndarray:
        return index.index.search(queries, k)[1]

    # Same answers (up to exact score ties) before timing anything.
    agree = float(np.mean(numpy_search()[:, 0] == faiss_search()[:, 0]))
    best = {"numpy": float("inf"), "faiss": float("inf")}
    for _ in range(repeats):
        for name, fn in (("numpy", numpy_search), ("faiss", faiss_search)):
            started = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - started)
    return {
        "n_items": n_items, "n_queries": n_queries, "dim": dim, "k": k,
        "faiss_qps": n_queries / best["faiss"], "numpy_qps": n_queries / best["numpy"],
        "ratio": best["numpy"] / best["faiss"], "top1_agreement": agree,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, required=True, help="prepared StableToolBench dataset folder")
    parser.add_argument("--generators", nargs="+", default=["tiny", "smollm2-135m"], help="rewriters to time")
    parser.add_argument("--queries", type=int, default=8, help="training queries in the timed round")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="description length cap")
    parser.add_argument("--warmup-examples", type=int, default=8,
                        help="S1b texts (untimed set-up; tiny always warms on the whole corpus)")
    parser.add_argument("--params", type=Path, default=REPO_ROOT / "params.yaml", help="params.yaml to start from")
    parser.add_argument("--search-items", type=int, nargs="+", default=[2_479, 50_000],
                        help="corpus sizes for the search benchmark (2,479 = StableToolBench APIs)")
    parser.add_argument("--search-queries", type=int, default=1_000, help="queries per search batch")
    parser.add_argument("--repeats", type=int, default=5, help="search timings: best of this many")
    parser.add_argument("--skip-round", action="store_true", help="only run the search benchmark")
    args = parser.parse_args()

    print("CoHyDE round benchmark (CPU, 1 thread; the machine may be shared: compare ratios, not seconds)")
    if not args.skip_round:
        print(f"\n{'generator':<14} {'stage':<20} {'seconds':>9} {'peak MiB':>9} {'+MiB':>7}  queries pairs")
        for generator in args.generators:
            for row in bench_round(generator, args.dataset, args.queries, args.max_new_tokens, args.params,
                                   args.warmup_examples):
                print(f"{row['generator']:<14} {row['stage']:<20} {row['seconds']:>9.2f} {row['peak_mib']:>9.0f} "
                      f"{row['growth_mib']:>7.0f}  {row['queries']:>7} {row['pairs']:>5}", flush=True)
    print(f"\n{'items':>7} {'queries':>7} {'dim':>4} {'k':>2} {'faiss q/s':>10} {'numpy q/s':>10} "
          f"{'faiss/numpy':>11} {'top1 agree':>10}")
    for n_items in args.search_items:
        r = bench_search(n_items, args.search_queries, 384, 5, args.repeats)
        print(f"{r['n_items']:>7} {r['n_queries']:>7} {r['dim']:>4} {r['k']:>2} {r['faiss_qps']:>10.0f} "
              f"{r['numpy_qps']:>10.0f} {r['ratio']:>10.2f}x {r['top1_agreement']:>10.3f}", flush=True)
    print(f"\nfaiss_vs_numpy={r['ratio']:.2f}")


if __name__ == "__main__":
    main()
