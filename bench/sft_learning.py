"""What CoGR's SFT buys per CPU-minute: val F1 and recall@100 after SFT, against the SFT queries
seen and the SFT minutes, per variant of ``--set`` overrides.

Each point is the real pipeline on ``bench/efficacy.py``'s data (the same seeded MetaTool subset and
splits as ``efficacy.py --method cogr --seed S``; params.yaml + params/cpu.yaml (or the ``--params``
overlays) + the variant's overrides + ``cogr.max_train_queries=N``), run as far as the SFT phase: the Algorithm 1 seeds, then
``00_sft``, whose record holds its own val evaluation (the SFT model's query keywords against the
SFT model's item index). Test is never read, so a setting chosen here is chosen on val.
Each point runs in a fresh subprocess on one torch thread, in a project folder of its own under
``--out`` (``<variant>-q<N>``); a finished point whose keys still match is reused, not re-trained.

- queries seen: the query-side SFT examples times ``cogr.sft.epochs`` (the train queries with seed
  keywords, capped at N); the item side's examples (every item) come on top;
- SFT min: the phase's own seconds (both sides; the seeds and data preparation not counted);
- peak MB: the peak resident memory of the process that trained the point (kept when it is reused;
  "-" for a point trained by an older version of this bench).

Every point's val F1 is compared with a reference point's (``--reference NAME@N``, default coevo
at its largest cap), paired over the same val queries: the difference with its 95% bootstrap CI
and randomisation p-value. The machine may be shared: compare minutes of one run, and val F1 of
any run (it is deterministic on one machine and numerics).

    .venv/bin/python bench/sft_learning.py --caps 800 1600
    .venv/bin/python bench/sft_learning.py --caps 800 --params params/cpu.yaml \\
        --params params/cpu_without_sft_levers.yaml --out bench/out/sft_learning_without_levers
    .venv/bin/python bench/sft_learning.py --data data/sample/metatool --queries 0 --caps 4 8 \\
        --set cogr.generator=tiny --set cogr.seed_generator=null --set cogr.max_empty_share=1.0 \\
        --set cogr.lora.top_layers=1  # the smoke run (the tiny model has 2 layers)

Writes ``sft_learning.{json,csv,png}`` in ``--out``, with the points of earlier invocations on the
same ``--out`` (``--only`` and ``--caps`` run a part at a time). The last lines are
``sft_val_f1_per_min_<variant>=<x>`` (val F1 after SFT over SFT minutes at its largest cap) and
last ``sft_learning_best=<variant>@<N> val_f1=<x> sft_min=<y>``: the point with the best val F1.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import resource
import sys
from pathlib import Path
from typing import Any

# One torch thread, as the efficacy runs train (efficacy.py, imported below, would default to every core).
os.environ.setdefault("COEVO_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]

# a sibling module: a script's own folder (bench/) is first on its path
from _workers import params_argv, params_files, parse_variants, run_json_worker  # noqa: E402

COLUMNS = ("variant", "cap", "queries_seen", "item_examples", "sft_min", "val_f1", "val_recall@100", "val_ndcg@10",
           "train_f1", "query_keywords_mean", "query_empty", "peak_mb", "val_f1_minus_reference")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "metatool",
                        help="a MetaTool source folder (all_clean_data.csv, plugin_des.json)")
    parser.add_argument("--queries", type=int, default=None,
                        help="seeded subset of its queries (default: efficacy.py's for cogr; 0 = all)")
    parser.add_argument("--seed", type=int, default=42, help="params seed: data split, seeds, SFT")
    parser.add_argument("--caps", type=int, nargs="+", default=[200, 400, 800],
                        help="values of cogr.max_train_queries: the SFT queries per epoch of each point")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE...]",
                        help="a variant besides coevo (the --params overlays as they are): --set overrides")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="run these variants only (default: coevo and every --variant)")
    parser.add_argument("--reference", default=None, metavar="NAME@N",
                        help="the point every other is compared with (paired over the val queries, 95%% bootstrap "
                             "CI); default: coevo at its largest cap")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of every variant (e.g. a smaller model)")
    parser.add_argument("--params", type=Path, action="append", default=None,
                        help="params overlays on params.yaml, coevo's point included (default: params/cpu.yaml); "
                             "repeatable")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "sft_learning",
                        help="where the points' project folders and the results go")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--point-overrides", default="[]", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if any(c < 1 for c in args.caps):
        parser.error("--caps: every cap must be at least 1")
    if args.reference is not None and not re.fullmatch(r"[^@]+@\d+", args.reference):
        parser.error(f"--reference {args.reference!r}: expected NAME@N, e.g. coevo@400")
    return args


# ------------------------------------------------------------------------------------ worker
def sft_point(project: Path, files: list[Path], source: Path, seed: int, overrides: list[str]) -> dict[str, Any]:
    """Seeds and SFT of one point in ``project``; the SFT record's val metrics and sizes."""
    import torch

    from coevo.config import load_params
    from coevo.orchestration.pipeline import Pipeline
    from efficacy import METHODS

    torch.set_num_threads(1)
    spec = METHODS["cogr"]
    project.mkdir(parents=True, exist_ok=True)
    os.chdir(project)
    # the splits of efficacy.py --method cogr with this seed: the same val queries
    params = load_params(files,
                         [f"seed={seed}", "data.loader=metatool", f"data.source={source}",
                          "data.dataset=sft_learning", f"data.val_fraction={spec['val']}",
                          f"data.test_fraction={spec['test']}", f"data.vague={spec['vague']}", *overrides])
    pipe = Pipeline("cogr", params)
    pipe.prepare().run()
    pipe.validate().run()
    method = pipe.method
    method.run_phase("seed")
    trained_here = not method.is_done("00_sft")
    record = method.run_phase("00_sft")
    peak_file = project / "sft_peak_mb.json"  # the peak of the process that trained it; a reuse keeps it
    if trained_here:
        peak_file.write_text(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0))
    train = record["train"]
    train = ast.literal_eval(train) if isinstance(train, str) else train  # older stamps hold its repr
    ev, words = record["eval"], record.get("keywords", {})
    # per-query val F1 from the phase's stored keywords (no generation): the paired comparisons' input
    per_query = method.evaluate(0, "val", per_query=True)["per_query"]["f1"]
    return {"val_f1_per_query": per_query, "queries_seen": int(train["query_examples"]) * params.cogr.sft.epochs,
            "item_examples": int(train.get("item_examples", 0)), "sft_min": record["seconds"] / 60,
            "val_f1": ev["f1"], "val_recall@100": ev["recall@100"], "val_ndcg@10": ev["ndcg@10"],
            "train_f1": (record.get("train_set") or {}).get("f1"), "query_keywords_mean": words.get("query_mean"),
            "query_empty": words.get("query_empty"),
            "peak_mb": json.loads(peak_file.read_text()) if peak_file.is_file() else None}


def run_point(args: argparse.Namespace, source: Path, name: str, cap: int, overrides: list[str]) -> dict[str, Any]:
    point = [*args.overrides, *overrides, f"cogr.max_train_queries={cap}"]
    cmd = [sys.executable, __file__, "--worker", str(args.out / f"{name}-q{cap}"), "--source", str(source),
           "--seed", str(args.seed), "--point-overrides", json.dumps(point),
           *params_argv(args.params)]
    return {"variant": name, "cap": cap, **run_json_worker(cmd, isa_cap=None, failure=f"sft_learning: {name} "
                                                                                      f"at cap {cap} failed")}


# ------------------------------------------------------------------------------------ report
def compare_with_reference(rows: list[dict[str, Any]], spec: str | None) -> dict[str, Any] | None:
    """Each row's val F1 minus the reference point's, paired over the val queries (95% bootstrap CI),
    as ``val_f1_minus_reference`` text; the reference row, or None when it is not among the points."""
    from dataclasses import asdict

    from coevo.report import difference_text
    from coevo.stats import paired_difference

    explicit = spec is not None
    if spec is None:
        mine = [r for r in rows if r["variant"] == "coevo"]
        spec = f"coevo@{max(r['cap'] for r in mine)}" if mine else ""
    name, _, cap = spec.partition("@")
    found = [r for r in rows if r["variant"] == name and str(r["cap"]) == cap]
    if not found:
        if explicit:  # the points stay on disk: run again with another --reference
            points = ", ".join(f"{r['variant']}@{r['cap']}" for r in rows)
            raise SystemExit(f"sft_learning: --reference {spec}: no such point (points: {points})")
        for r in rows:
            r["val_f1_minus_reference"] = "-"
        return None
    ref = found[0]
    for r in rows:
        if r is ref:
            r["val_f1_minus_reference"] = "reference"
            continue
        if "val_f1_per_query" not in r or "val_f1_per_query" not in ref:  # a point of an older version of this bench
            r["val_f1_minus_reference"] = "- (run the point again for its per-query values)"
            continue
        diff = paired_difference(r["val_f1_per_query"], ref["val_f1_per_query"])
        r["val_f1_minus_reference"] = f"{difference_text(asdict(diff))} (n={diff.n})"
    return ref


def plot(rows: list[dict[str, Any]], dest: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = sorted((r for r in rows if r["variant"] == name), key=lambda r: r["queries_seen"])
        for ax, x in zip(axes, ("queries_seen", "sft_min")):
            ax.plot([r[x] for r in mine], [r["val_f1"] for r in mine], marker="o", label=name)
    axes[0].set_xlabel("SFT queries seen (examples x epochs)")
    axes[1].set_xlabel("SFT minutes (one thread)")
    for ax in axes:
        ax.set_ylabel("val F1 after SFT")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("CoGR: what SFT buys (val only)")
    fig.tight_layout()
    fig.savefig(dest, dpi=100)
    plt.close(fig)
    return dest


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(sft_point(Path(args.worker), params_files(args.params), args.source, args.seed,
                                   json.loads(args.point_overrides))))
        return 0
    # Points of earlier invocations on this --out stay in the report (--only runs a part at a time).
    record = args.out.resolve() / "sft_learning.json"
    earlier = json.loads(record.read_text()) if record.is_file() else None
    overlays = [str(path) for path in params_files(args.params)[1:]]
    default_overlays = [str(path) for path in params_files(None)[1:]]  # a record older than --params used them
    if earlier and ((earlier["seed"], earlier["data"], earlier["overrides"], earlier.get("params", default_overlays))
                    != (args.seed, str(args.data), args.overrides, overlays)):
        raise SystemExit(f"sft_learning: {args.out} holds points of seed {earlier['seed']}, --data "
                         f"{earlier['data']}, --set {earlier['overrides']}, --params "
                         f"{earlier.get('params', default_overlays)}: pass another --out")
    earlier = earlier or {"variants": {}, "rows": []}
    variants = {"coevo": [], **parse_variants(args.variant, "sft_learning")}
    if args.only:
        unknown = [v for v in args.only if v not in variants]
        if unknown:
            raise SystemExit(f"sft_learning: --only {', '.join(unknown)}: no such variant ({', '.join(variants)})")
        variants = {k: v for k, v in variants.items() if k in args.only}
    from coevo.config import load_params

    for name, overrides in variants.items():  # a bad knob fails here, in one line, before any work
        try:
            load_params(params_files(args.params), [*args.overrides, *overrides])
        except ValueError as exc:
            raise SystemExit(f"sft_learning: variant {name}: {exc}") from None
        if earlier["variants"].get(name, overrides) != overrides:
            raise SystemExit(f"sft_learning: variant {name} in {record} was {earlier['variants'][name]}, now "
                             f"{overrides}: give it another name")
    from efficacy import data_source

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    source = data_source("cogr", args.data.resolve(), args.out, args.queries, args.seed)
    rows = {(r["variant"], r["cap"]): r for r in earlier["rows"]}

    def save() -> None:
        record.write_text(json.dumps({"seed": args.seed, "data": str(args.data), "overrides": args.overrides,
                                      "params": overlays,
                                      "variants": {**earlier["variants"], **variants},
                                      "rows": list(rows.values())}, indent=1) + "\n")

    for name, overrides in variants.items():
        for cap in sorted(set(args.caps)):
            row = run_point(args, source, name, cap, overrides)
            print(f"{name} q{cap}: " + ", ".join(f"{k}={row[k]:.4g}" if isinstance(row[k], float) else f"{k}={row[k]}"
                                                for k in COLUMNS[2:-1]), file=sys.stderr, flush=True)
            rows[name, cap] = row
            save()  # after every point: a later failure keeps the points before it
    reference = compare_with_reference(sorted(rows.values(), key=lambda r: (r["variant"], r["cap"])), args.reference)
    save()
    rows = sorted(rows.values(), key=lambda r: (r["variant"], r["cap"]))
    with (args.out / "sft_learning.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: r.get(k) for k in COLUMNS} for r in rows)
    png = plot(rows, args.out / "sft_learning.png")

    from rich.console import Console
    from rich.table import Table

    ref_text = f"{reference['variant']}@{reference['cap']}" if reference else "none"
    table = Table(title=f"CoGR SFT: val after SFT per queries seen (seed {args.seed}; val only, test not read; "
                        f"reference {ref_text})")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(*(f"{r[c]:.4f}" if isinstance(r[c], float) and c.startswith(("val", "train"))
                        else f"{r[c]:.0f}" if c == "peak_mb" and r[c] is not None
                        else f"{r[c]:.2f}" if isinstance(r[c], float) else "-" if r[c] is None
                        else str(r[c]) for c in COLUMNS))
    Console(width=180).print(table)
    print(f"results: {record}, {args.out / 'sft_learning.csv'}, {png}")
    for name in dict.fromkeys(r["variant"] for r in rows):
        r = max((r for r in rows if r["variant"] == name), key=lambda r: r["cap"])
        print(f"sft_val_f1_per_min_{name}={r['val_f1'] / max(r['sft_min'], 1e-9):.4f}")
    best = max(rows, key=lambda r: (r["val_f1"], -r["sft_min"]))
    print(f"sft_learning_best={best['variant']}@{best['cap']} val_f1={best['val_f1']:.4f} sft_min={best['sft_min']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
