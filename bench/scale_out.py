"""Scale-out of the corpus-wide passes: local vs Ray at 1 and 2 workers, and a cost model.

Measured in one run, on this machine (so its load cancels in the ratios):

- CoGR item-keyword generation (greedy, the generator SmolLM2-135M by default, CoGR's item
  prompts over the embedded MetaTool sample's tools, cycled to ``--items``);
- corpus embedding (all-MiniLM-L6-v2, ``title: text`` renderings, ``--embed-items``);

each through ``coevo.compute`` with ``compute.backend`` local, then Ray with 1 and with 2
worker actors of 1 CPU each (a local Ray instance with 2 CPUs). Printed: items/s per
backend (the whole pass, which starts its actor pool and loads the model in every worker;
``steady``: items over the busiest worker's model time, timed inside the workers), ratios against
local, that Ray's outputs equal the local ones, Ray's start-up overhead (``ray.init`` and the
per-pass pool start-up, from the workers' own timings), and the driver's per-item cost of building the item index.

From these per-item costs it prints a cost model of one CoGR round (computed, not measured;
assumptions printed with it) for 10k to 10M items on 1, 8 and 64 GPU workers.
The last line is ``ray_2w_vs_local=<x>``: item-keyword generation items/s with 2 Ray workers
(whole pass) over local.

Usage: ``python bench/scale_out.py [--items 96] [--embed-items 2048] [--model smollm2-135m]``
(``--model tiny`` for a quick rehearsal).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def metatool_items(n: int) -> list[tuple[str, str]]:
    tools = json.loads((ROOT / "data" / "sample" / "metatool" / "plugin_des.json").read_text())
    pairs = sorted(tools.items())
    return [(f"{pairs[i % len(pairs)][0]} {i // len(pairs)}" if i >= len(pairs) else pairs[i][0],
             pairs[i % len(pairs)][1]) for i in range(n)]


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def compute_params(workers: int, batch_size: int):
    from coevo.config import section

    return section("compute", backend="ray", workers=workers, batch_size=batch_size, cpus_per_worker=1.0,
                   gpus_per_worker=0.0)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=96, help="items whose keywords are generated")
    parser.add_argument("--embed-items", type=int, default=2048, help="items embedded with MiniLM")
    parser.add_argument("--model", default="smollm2-135m", help="generator: smollm2-135m | tiny | a path")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="CoGR's sampling.max_new_tokens")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per model batch (CoGR on CPU: 16)")
    parser.add_argument("--index-items", type=int, default=50_000, help="synthetic items for the index-build cost")
    parser.add_argument("--gpu-speedup", type=float, default=50.0,
                        help="cost model: a GPU worker's per-item speed over one measured CPU worker (ASSUMED)")
    parser.add_argument("--queries", type=int, default=100_000, help="cost model: training queries per round")
    args = parser.parse_args()

    import numpy as np
    import ray

    from coevo.compute import embed_texts, generate_texts, last_pass
    from coevo.models.encoder import item_text, load_text_encoder
    from coevo.models.generator import Generator
    from coevo.models.prompts import item_messages
    from coevo.runtime import limit_cpu_threads

    limit_cpu_threads()
    items = metatool_items(max(args.items, args.embed_items))
    prompts = [item_messages(t, d) for t, d in items[: args.items]]
    texts = [item_text(t, d) for t, d in items[: args.embed_items]]
    corpus = [f"{t} {d}" for t, d in items]
    print(f"scale_out: {args.items} items x {args.max_new_tokens} new tokens with {args.model} (model batch "
          f"{args.batch_size}); {args.embed_items} items embedded with all-MiniLM-L6-v2; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other jobs share this machine)")

    generator = Generator.create(args.model, None, seed=0, corpus=corpus)
    scratch = Path(tempfile.mkdtemp(prefix="scale-out-"))
    _, save_s = timed(lambda: generator.save(scratch / "generator"))  # a phase folder, as in a run
    settings = dict(temperature=0.0, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, seed=0)
    encoder = load_text_encoder("all-minilm-l6-v2")

    results: dict[str, dict[str, float]] = {"generate": {}, "embed": {}}
    want_gen, t = timed(lambda: generate_texts(generator, prompts, **settings))
    results["generate"]["local"] = t
    want_emb, t = timed(lambda: embed_texts(encoder, texts, batch_size=64))
    results["embed"]["local"] = t
    local_rss = peak_rss_mb()

    _, init_s = timed(lambda: ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False))
    stats: dict[str, dict[int, dict]] = {"generate": {}, "embed": {}}
    identical = {"generate": True, "embed": True}
    for workers in (1, 2):
        compute = compute_params(workers, args.batch_size)
        got, t = timed(lambda: generate_texts(None, prompts, compute=compute, checkpoint=scratch / "generator",
                                              **settings))
        results["generate"][f"ray_{workers}w"] = t
        stats["generate"][workers] = last_pass()
        identical["generate"] &= got == want_gen
        ecompute = compute_params(workers, 256)
        got_emb, t = timed(lambda: embed_texts(None, texts, compute=ecompute, checkpoint="all-minilm-l6-v2",
                                               batch_size=64))
        results["embed"][f"ray_{workers}w"] = t
        stats["embed"][workers] = last_pass()
        identical["embed"] &= bool(np.array_equal(got_emb, want_emb))
    ray.shutdown()
    shutil.rmtree(scratch, ignore_errors=True)

    # Driver side of a round: the item index over N keyword sets (what the driver keeps in memory).
    rng = np.random.default_rng(0)
    vocab = [f"kw{i} term{i % 97}" for i in range(200_000)]
    sets = {f"i{i}": [vocab[j] for j in rng.integers(0, len(vocab), 10)] for i in range(args.index_items)}
    from coevo.retrieval.inverted_index import InvertedIndex

    tracemalloc.start()
    _, index_s = timed(lambda: InvertedIndex.from_keyword_sets(sets))
    index_bytes = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    sets_bytes = sum(len(k) + 57 for v in sets.values() for k in v) + 120 * len(sets)  # str objects + list/dict slots

    n = {"generate": args.items, "embed": args.embed_items}
    print(f"\n{'pass':<10} {'backend':<8} {'items/s':>9} {'vs local':>9} {'steady items/s':>15} {'start-up s':>11} "
          f"{'identical':>10}")
    for kind in ("generate", "embed"):
        base = n[kind] / results[kind]["local"]
        for name, seconds in results[kind].items():
            workers = int(name[4]) if name.startswith("ray_") else 0
            st = stats[kind].get(workers)
            steady = n[kind] / max(st["busy"].values()) if st else n[kind] / seconds
            print(f"{kind:<10} {name:<8} {n[kind] / seconds:>9.2f} {n[kind] / seconds / base:>9.2f} {steady:>15.2f} "
                  f"{(st['startup'] if st else 0.0):>11.1f} {str(identical[kind]) if st else '-':>10}")
    print("  items/s: the whole pass; steady: items / the busiest worker's model time (no pool start-up); "
          "start-up: wall - busiest worker (actor processes, imports, model load, scheduling)")
    print(f"ray start-up: ray.init {init_s:.1f}s (local instance, 2 CPUs) once per process, plus each pass's pool "
          f"start-up above; saving the generator for the workers {save_s:.2f}s (not needed when the phase folder "
          f"exists); driver peak RSS {local_rss:.0f} MB")
    per_index = index_s / args.index_items
    per_index_mem = (index_bytes + sets_bytes) / args.index_items
    print(f"driver: item index build {per_index * 1e6:.1f} us/item, keyword sets + index ~{per_index_mem:.0f} B/item "
          f"(10 keywords/item, {args.index_items} synthetic items)")

    # ------------------------------------------------------------------ cost model (computed)
    one, two = stats["generate"][1], stats["generate"][2]
    c_gen = sum(one["busy"].values()) / args.items  # s per item on one CPU worker, model work only
    eff2 = (sum(one["busy"].values()) / 2) / max(two["busy"].values())  # 1 = two workers split it evenly
    eff = min(1.0, max(eff2, 0.5))
    c_gpu = c_gen / args.gpu_speedup
    pool = max(one["startup"], two["startup"])
    print(f"\ncost model of one CoGR round (COMPUTED from the per-item costs above, not measured):")
    print(f"  assumptions: a GPU worker generates {args.gpu_speedup:g}x faster per item than one measured CPU worker "
          f"({1 / c_gen:.2f} items/s -> {1 / c_gpu:.0f} items/s; ASSUMED, measure with this script on a GPU worker); "
          f"parallel efficiency {eff:.2f} (measured 1->2 workers, clamped to [0.5, 1]) at every worker count; "
          f"a round regenerates every item's keywords once and {args.queries} training queries' once "
          f"(query prompts cost as much as item prompts); pool start-up {pool:.0f}s per pass, 2 passes; "
          f"GRPO training itself is capped (cogr.grpo.max_prompts_per_phase) and not in the model; "
          f"driver index build and memory as measured; worker memory = SmolLM2-135M bf16 weights 0.27 GB + "
          f"KV cache for a batch of 256 x 320 tokens (30 layers x 2 x 192 x 2 B = 23 KB/token, ~1.9 GB), "
          f"i.e. ~2.2 GB per GPU worker whatever N")
    print(f"  {'items':>10} {'workers':>8} {'generation h':>13} {'driver index s':>15} {'round h':>8} "
          f"{'driver GB':>10} {'worker GB':>10}")
    for items_n in (10_000, 100_000, 1_000_000, 10_000_000):
        for workers in (1, 8, 64):
            gen_s = (items_n + args.queries) * c_gpu / (workers * (eff if workers > 1 else 1.0)) + 2 * pool
            idx_s = items_n * per_index
            print(f"  {items_n:>10,} {workers:>8} {gen_s / 3600:>13.3f} {idx_s:>15.1f} {(gen_s + idx_s) / 3600:>8.3f} "
                  f"{items_n * per_index_mem / 1e9:>10.2f} {2.2:>10.1f}")
    ratio = (n["generate"] / results["generate"]["ray_2w"]) / (n["generate"] / results["generate"]["local"])
    print(f"ray_2w_vs_local={ratio:.2f}")


if __name__ == "__main__":
    main()
