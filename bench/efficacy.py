"""Efficacy: does a method beat its own start on real data, with 95% confidence, within a CPU budget?

One seeded run of the method's real pipeline (``coevo.orchestration.pipeline.Pipeline``: prepare, validate,
the method's phases, baselines, final evaluation, reports) in a project folder of its own:

1. the data: a seeded subset of a full data set (``--queries``; MetaTool has 20k queries, the
   test split is sized so that the headline metric's 95% CI half-width stays near 0.03);
2. params: params.yaml + params/cpu.yaml (the CPU settings) + ``--set`` overrides;
3. train: the method's phases in order while the wall-clock budget lasts (a phase starts only
   when the last phase of its kind says it fits; early stopping on val as configured);
4. evaluate: BM25 and dense baselines (k for F1@k chosen on val), the method's start and the
   phase chosen on val, read once on test; every difference with its paired-bootstrap 95% CI.

The comparison each paper makes (``--vague``, default per method, coevo.data.vague):

- CoHyDE and CoGR: ``test_copy``, the final table on test and again on the ``vague`` split
  (every test query with its relevant tools' own words taken out);
- GRAPE: ``all_queries``, the shift setting: every query (train, val, test) is vague, so the
  frozen retriever's raw query is weak, and the rewriter trains and is measured on that shift.

Printed: one line per phase, the final table(s), where the learning curves are (MLflow run and a
PNG), ``<method>_gain_ci_low=<x>`` (the lower bound of the 95% CI of final - start on the headline
metric), and last ``<method>_vs_baseline_ci_low=<x>``: the same for final - the baseline the
paper claims to beat, on the comparison the paper makes: CoGR test F1 - BM25's F1@k (k chosen on
val; the dense baseline stays a row and ``vs best baseline`` when it is best on val); GRAPE test R@10 - the raw query under the same frozen encoder, in the shift
setting; CoHyDE NDCG@5 on the vague set - S1a (the encoder fine-tuned alone, on the raw query).
Library output (TRL's per-step dictionaries, warnings, progress bars) goes to ``<out>/efficacy.log``;
the results, as data, to ``<out>/efficacy.json`` (``bench/seeds.py`` sets seeds side by side).

Usage::

    python bench/efficacy.py --method cogr --data ../shared/data/metatool --budget-min 60
    python bench/efficacy.py --method grape --data ../shared/data/metatool --budget-min 60
    python bench/efficacy.py --method cohyde --data ../shared/data/stabletoolbench --budget-min 60
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# The bench has the machine to itself: every core for torch (coevo.runtime would give a small model one).
os.environ.setdefault("COEVO_THREADS", str(os.cpu_count() or 1))

ROOT = Path(__file__).resolve().parents[1]

from coevo.cli.terminal import LibraryOutputToLog  # noqa: E402 - after the environment above

if TYPE_CHECKING:  # types only: the bench imports its heavy modules when it runs
    from coevo.config import Params
    from coevo.methods.base import Method
    from coevo.orchestration.pipeline import Pipeline
    from coevo.orchestration.tracking import Tracker

# Per method: the loader of --data, the headline metric of the gain line, the default query subset,
# the split fractions (test sized for the CI; val for early stopping and k*), the vague-query
# setting of the paper's comparison, and the split its vs-baseline line is read on.
METHODS: dict[str, dict[str, Any]] = {
    "cogr": {"loader": "metatool", "headline": "f1", "queries": 3000, "val": 0.1, "test": 0.3,
             "vague": "test_copy", "target_split": "test"},
    "grape": {"loader": "metatool", "headline": "recall@10", "queries": 3000, "val": 0.1, "test": 0.3,
              "vague": "all_queries", "target_split": "test"},
    "cohyde": {"loader": "stabletoolbench", "headline": "ndcg@5", "queries": None, "val": 0.15, "test": 0.4,
               "vague": "test_copy", "target_split": "vague"},
}
LOADERS = ("metatool", "stabletoolbench", "wands", "beir", "image_captions", "prepared")
RECORD = "efficacy.json"  # in --out: the run's results as data (write_record)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train one method for a wall-clock budget on real data and measure its gain over its start "
                    "on held-out test queries (95% paired-bootstrap CIs).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--method", required=True, choices=sorted(METHODS))
    parser.add_argument("--data", required=True, type=Path,
                        help="the source folder --loader reads (default: MetaTool for cogr/grape, StableToolBench "
                             "for cohyde); your own data: any loader's source, e.g. --loader beir, or a folder "
                             "`coevo data prepare` wrote, with --loader prepared (its splits kept)")
    parser.add_argument("--loader", choices=LOADERS, default=None,
                        help="the loader of --data (default per method: metatool for cogr/grape, stabletoolbench "
                             "for cohyde); a MetaTool source is subset by --queries, any other is used whole")
    parser.add_argument("--vague", choices=("none", "test_copy", "train_copy", "all_queries"), default=None,
                        help="vague queries (data.vague): test_copy also reports the final table on vague copies "
                             "of the test queries; train_copy does that and trains (and chooses on val) with vague "
                             "copies of the train and val queries beside theirs; all_queries makes every query vague "
                             "(the shift setting). "
                             "Default: all_queries for grape, test_copy for cogr and cohyde")
    parser.add_argument("--budget-min", type=float, required=True,
                        help="wall-clock minutes for data preparation and training (the final test evaluation "
                             "comes after it and is timed separately), counted from this process's start; 0 on a "
                             "finished --out evaluates what is trained there without training further")
    parser.add_argument("--seed", type=int, default=42, help="params seed: data split, sampling, training")
    parser.add_argument("--queries", type=int, default=None,
                        help="seeded subset of the source's queries (default per method; 0 = all)")
    parser.add_argument("--params", type=Path, action="append", default=None,
                        help="params overlays on params.yaml (default: params/cpu.yaml); repeatable")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one knob, e.g. --set cogr.grpo.learning_rate=1e-4; repeatable")
    parser.add_argument("--out", type=Path, default=None,
                        help="project folder of this run (default bench/out/efficacy-<method>-s<seed>); a "
                             "finished phase there is reused when its key matches")
    parser.add_argument("--fresh", action="store_true", help="delete --out first")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------ data
def metatool_subset(source: Path, dest: Path, n_queries: int, seed: int) -> Path:
    """MetaTool with ``n_queries`` of its single-tool queries, drawn with ``seed`` (every tool kept)."""
    import numpy as np
    import pandas as pd

    frame = pd.read_csv(source / "all_clean_data.csv")
    queries = sorted(frame["Query"].astype(str).unique())
    if n_queries and n_queries < len(queries):
        keep = set(np.random.default_rng(seed).choice(queries, size=n_queries, replace=False))
        frame = frame[frame["Query"].astype(str).isin(keep)]
    dest.mkdir(parents=True, exist_ok=True)
    frame.to_csv(dest / "all_clean_data.csv", index=False)
    shutil.copy2(source / "plugin_des.json", dest / "plugin_des.json")
    return dest


def data_source(method: str, data: Path, out: Path, n_queries: int | None, seed: int, loader: str | None = None) -> Path:
    spec = METHODS[method]
    loader = loader or spec["loader"]
    if not data.exists():
        raise SystemExit(f"--data {data}: no such folder")
    if loader == "metatool":
        if not (data / "all_clean_data.csv").is_file():
            raise SystemExit(f"{data}: not a MetaTool folder (no all_clean_data.csv)")
        default = spec["queries"] if spec["loader"] == "metatool" else None
        return metatool_subset(data, out / "source", default if n_queries is None else n_queries, seed)
    if n_queries:
        raise SystemExit(f"--queries: a {loader} source is used whole")
    return data.resolve()


# -------------------------------------------------------------------------------- terminal
class Terminal(LibraryOutputToLog):
    """Our time-stamped lines on the real stdout (and in the log); library output to the log only."""

    def __enter__(self) -> "Terminal":
        super().__enter__()
        logging.captureWarnings(True)
        warnings.simplefilter("default")  # every warning once per place, in the log
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        logging.captureWarnings(False)
        super().__exit__(*exc)

    def say(self, message: str) -> None:
        line = f"[{(time.perf_counter() - self.started) / 60:5.1f} min] {message}"
        print(line, file=self.out)
        print(line, file=self.log)

    def print_rich(self, renderable: Any) -> None:
        from rich.console import Console

        Console(file=self.out, width=120).print(renderable)
        Console(file=self.log, width=120).print(renderable)


# ------------------------------------------------------------------------------- the run
def phase_line(record: dict[str, Any], headline: str, seconds: float) -> str:
    ev = record.get("eval") or {}
    parts = [f"{record.get('name', record.get('stage', '?'))}: {seconds / 60:.1f} min"]
    if headline in ev:
        parts.append(f"val {headline}={ev[headline]:.4f}")
    elif ev:
        key = next(iter(ev))
        parts.append(f"val {key}={ev[key]:.4f}")
    train = record.get("train") or {}
    if train.get("reward_first") is not None:
        parts.append(f"reward {train['reward_first']:+.3f} -> {train['reward_last']:+.3f}")
        parts.append(f"zero-std groups {train.get('frac_reward_zero_std') or 0:.2f}")
        if train.get("groups_solved_in_none_share") is not None:  # where the signal went (train_grpo)
            solved_all = train.get("groups_solved_in_all_share")
            parts.append(f"groups solved in none {train['groups_solved_in_none_share']:.2f}"
                         + (f", in all {solved_all:.2f}" if solved_all is not None else ""))
        parts.append(f"{train.get('steps', 0)} steps of {train.get('step_seconds') or 0:.1f}s")
        if train.get("rollouts_per_min"):
            share = train.get("generation_share")
            parts.append(f"{train['rollouts_per_min']:.0f} rollouts/min"
                         + (f", {share:.0%} of it sampling" if share is not None else ""))
    return ", ".join(parts)


def kind_of(name: str) -> str:
    """Phases of one kind take about as long as each other: ``02_item`` -> item, ``round_3`` -> round."""
    head, _, tail = name.partition("_")
    return tail if head.isdigit() else head


def unit_of(name: str, phases: Sequence[str]) -> str:
    """The phase a sub-phase belongs to (CoHyDE's ``round_2_s3`` -> ``round_2``), else ``name``: the
    budget decides before a unit's first sub-phase, never inside it (half a round trains nothing)."""
    return next((p for p in phases if p != name and name.startswith(p + "_")), name)


def train_within(pipe: Pipeline, budget_s: float, started: float, term: "Terminal", headline: str,
                 phase_done: Callable[[], None] | None = None) -> tuple[list[str], str]:
    """Run the pending phases while the budget lasts, calling ``phase_done()`` after each; returns
    (phases run here, why training stopped). A phase starts only when the last phase of its kind
    (a whole round, for CoHyDE's sub-phases) says it fits."""
    names = [p.name for p in pipe.method.phases()]
    last_seconds: dict[str, float] = {}
    ran = []
    unit, unit_seconds = None, 0.0
    evaluated = False  # the budget may stop training only once a phase with a val score (a model) exists
    for step in pipe.train_steps():
        name = step.name.split("-", 1)[1]
        if (this_unit := unit_of(name, names)) != unit:
            if unit is not None:
                last_seconds[kind_of(unit)] = unit_seconds
            unit, unit_seconds = this_unit, 0.0
            elapsed = time.perf_counter() - started
            expected = last_seconds.get(kind_of(unit), 0.0)
            if evaluated and elapsed >= budget_s:
                return ran, f"budget spent before {unit}"
            if evaluated and elapsed + expected > budget_s:
                return ran, (f"budget: {unit} would end near {(elapsed + expected) / 60:.0f} min "
                             f"(the last {kind_of(unit)} phase took {expected / 60:.1f} min)")
        was_done = step.done()
        began = time.perf_counter()
        record = step.run()
        seconds = time.perf_counter() - began
        unit_seconds += record.get("seconds", seconds) if was_done else seconds
        ran.append(name)
        evaluated = evaluated or bool(record.get("eval"))
        term.say(("(reused) " if was_done else "") + phase_line({"name": name, **record}, headline, seconds))
        if phase_done is not None:
            phase_done()
    return ran, "all planned phases ran (or early stopping ended training)"


def log_curves(tracker: Tracker, method: Method, out: Path) -> Path | None:
    """The GRPO curves as CSV and PNG artifacts (the flows' per-phase and per-step series were
    logged while training ran)."""
    from coevo.report import write_csv

    rows = method.training_curve()
    if not rows:
        return None
    csv_path = write_csv(rows, out / "curves.csv")
    png = plot_curves(rows, out / "curves.png")
    tracker.log_artifact(csv_path)
    tracker.log_artifact(png)
    return png


def plot_curves(rows: list[dict[str, Any]], dest: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ("reward", "reward_std", "frac_reward_zero_std", "kl", "completions/mean_length", "step_time")
            if any(k in r for r in rows)]
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 1.8 * len(keys)), sharex=True)
    axes = [axes] if len(keys) == 1 else list(axes)
    for ax, key in zip(axes, keys):
        for phase in dict.fromkeys(r["phase"] for r in rows):
            pts = [(r["global_step"], r[key]) for r in rows if r["phase"] == phase and key in r]
            if pts:
                ax.plot(*zip(*pts), marker=".", label=phase)
        ax.set_ylabel(key.replace("completions/", ""), fontsize=8)
    axes[0].legend(fontsize=7, ncol=4)
    axes[-1].set_xlabel("GRPO step (all phases)")
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def headline_ci(final: dict[str, Any], metric: str, bootstrap: dict[str, Any]) -> str:
    """The chosen phase's test mean of ``metric`` with its 95% CI half-width (the test set's precision)."""
    from coevo.stats import mean_ci

    row = next(r for r in final["rows"] if r["phase"] == final["best_phase"])
    values = row.get("per_query", {}).get(metric)
    if not values:
        return f"{metric}: no per-query values"
    ci = mean_ci(values, resamples=bootstrap["resamples"], seed=bootstrap["seed"], confidence=bootstrap["confidence"])
    return (f"final test {metric} = {ci.mean:.4f} [{ci.ci_low:.4f}, {ci.ci_high:.4f}] "
            f"(half-width {(ci.ci_high - ci.ci_low) / 2:.4f}, n={ci.n})")


def run(args: argparse.Namespace) -> int:
    spec = METHODS[args.method]
    out = (args.out or ROOT / "bench" / "out" / f"efficacy-{args.method}-s{args.seed}").resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    from _workers import params_files

    overlays = params_files(args.params)
    started = time.perf_counter()
    source = data_source(args.method, args.data.resolve(), out, args.queries, args.seed, args.loader)
    vague = args.vague or spec["vague"]
    overrides = [f"seed={args.seed}", f"data.loader={args.loader or spec['loader']}", f"data.source={source}",
                 f"data.dataset={args.method}_efficacy", f"data.val_fraction={spec['val']}",
                 f"data.test_fraction={spec['test']}", f"data.vague={vague}", *args.overrides]
    from coevo.config import load_params

    params = load_params(overlays, overrides)  # a bad knob fails here, before any work
    with Terminal(out / "efficacy.log") as term:
        return _run(args, params, overlays, overrides, out, term, started, spec)


def _run(args, params, overlays, overrides, out, term, started, spec) -> int:
    from coevo import progress, report
    from coevo.config import flatten
    from coevo.orchestration.pipeline import Pipeline
    from coevo.orchestration.flow import LiveSeries, LiveSteps
    from coevo.orchestration.tracking import Tracker

    os.chdir(out)  # the run's project folder: data/, .coevo/, mlflow.db
    headline = spec["headline"]
    term.say(f"{args.method} on {args.data} (queries: {(args.queries if args.queries is not None else spec['queries']) or 'all'}), "
             f"seed {args.seed}, budget {args.budget_min:g} min; project {out}; library output: {term.log_path}")
    term.say("params: " + " + ".join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in overlays)
             + (f"  --set {' '.join(args.overrides)}" if args.overrides else ""))
    pipe = Pipeline(args.method, params)
    pipe.record_params()  # the run folder says how it was trained: `coevo search -m` and `coevo evaluate` read it
    pipe.prepare().run()
    pipe.validate().run()
    counts = json.loads((pipe.layout.processed / "dataset.json").read_text()).get("counts", {})
    term.say(f"data: {counts}")
    with Tracker(uri=params.tracking.uri, artifact_root=params.tracking.artifact_root,
                 experiment=f"efficacy-{args.method}", run_name=f"{args.method}-s{args.seed}-{args.budget_min:g}min",
                 system_metrics_s=params.tracking.system_metrics_s) as tr:
        tr.log_params({"budget_min": args.budget_min, "seed": args.seed, "queries": args.queries or spec["queries"],
                       "overlays": ",".join(p.name for p in overlays), "overrides": " ".join(args.overrides),
                       **{k: v for k, v in flatten(params.model_dump(mode="json")).items()
                          if k.split(".")[0] in (args.method, "seed", "data", "evaluation")}})
        # Live, as a flow's run: each trainer step while it trains (live/<phase>/...), each phase's
        # val metrics (val/...) and GRPO curves as the phase ends.
        live = LiveSeries(tr)
        done_before = [p.name for p in pipe.method.phases() if pipe.method.is_done(p.name)]  # reused, not timed
        with progress.listening(LiveSteps(tr)):
            ran, why = train_within(pipe, args.budget_min * 60, started, term, headline,
                                    phase_done=lambda: live.log(pipe.method))
        live.log(pipe.method)  # phases reused from an earlier run of this folder
        train_s = time.perf_counter() - started
        term.say(f"training stopped: {why}; {train_s / 60:.1f} min of the {args.budget_min:g} min budget")
        png = log_curves(tr, pipe.method, out)
        eval_started = time.perf_counter()
        results = {}
        for step in pipe.evaluate_steps():
            results[step.name] = step.run()
            term.say(f"{step.label}: done")
        table = results[f"{args.method}-reports"]["table"]
        final = results[f"{args.method}-final"]
        tr.log_metrics(report.tracking_metrics(table))
        tr.set_tags({**report.table_tags(table), "efficacy.stopped": why})
        tables = {"test": table}
        if params.data.vague in ("test_copy", "train_copy"):
            tables["vague"] = vague_table(args.method, params)
            term.say("final evaluation on the vague split: done")
            tr.log_metrics({k.replace("compare/", "compare_vague/", 1): v
                            for k, v in report.tracking_metrics(tables["vague"]).items()})
        tr.log_metrics({"time/train_min": train_s / 60, "time/eval_min": (time.perf_counter() - eval_started) / 60})
        url = tr.run_url()
    term.say(f"final evaluation: {(time.perf_counter() - eval_started) / 60:.1f} min")
    setting = {"test_copy": "; vague: test queries without their tools' words",
               "train_copy": "; vague: test queries without their tools' words (vague copies of train and val "
                             "queries trained on)",
               "all_queries": "; every query vague (the shift setting)"}.get(params.data.vague, "")
    for split, t in tables.items():
        term.print_rich(report.metrics_table(t["rows"], t["columns"], title=f"{args.method}: efficacy ({split}, "
                                             f"n={t['n_queries']}; val rows choose the phase{setting})"))
    term.say(headline_ci(final, headline, params.evaluation.bootstrap.model_dump()))
    gain = comparison(table, report.VS_START, headline)
    term.say(f"gain of {table['best_phase']} over {table['start_phase']} on test {headline}: "
             f"{report.difference_text(gain)} (n={gain['n']})")
    target_split = spec["target_split"] if spec["target_split"] in tables else "test"
    versus = {}
    for split, t in tables.items():
        paper = t["paper_baseline"]
        versus[split] = comparison(t, paper["name"], headline)
        term.say(f"{t['best_phase']} minus the paper's baseline ({paper['row']}) on {split} {headline}: "
                 f"{report.difference_text(versus[split])} (n={versus[split]['n']})"
                 + ("  <- the target" if split == target_split else ""))
    term.say(f"curves: {png or 'no GRPO steps ran'}; MLflow run: {url} (mlflow ui --backend-store-uri "
             f"{params.tracking.uri} from {out})")
    total_min = (time.perf_counter() - started) / 60
    term.say(f"total {total_min:.1f} min")
    record = write_record(out / RECORD, args, overrides, tables, target_split, gain, versus,
                          numerics=pipe.method.numerics_of(table["best_phase"]), stopped=why,
                          phases_trained=[n for n in ran if n not in done_before], phases_reused=done_before,
                          minutes={"train": train_s / 60, "total": total_min})
    term.say(f"record: {record} (seeds side by side: python bench/seeds.py <--out of each seed>)")
    print(f"{args.method}_gain_ci_low={gain['ci_low']:.4f}", file=term.out)
    print(f"{args.method}_vs_baseline_ci_low={versus[target_split]['ci_low']:.4f}", file=term.out)
    return 0


def write_record(dest: Path, args: argparse.Namespace, overrides: list[str], tables: dict[str, dict[str, Any]],
                 target_split: str, gain: dict[str, Any], versus: dict[str, dict[str, Any]], **run: Any) -> Path:
    """What this run printed, as data (``bench/seeds.py`` reads one per seed): the final table of each
    split (rows without per-query values, every paired comparison), the two target lines, and how the
    run was made (seed, data, --set, the chosen phase's numerics, why training stopped, minutes). The
    minutes are this process's: phases reused from an earlier run of the folder are listed, not timed."""
    from coevo.io import write_json

    return write_json(dest, {
        "method": args.method, "seed": args.seed, "data": str(args.data), "loader": args.loader,
        "budget_min": args.budget_min, "queries": args.queries, "overrides": list(args.overrides),
        "resolved_overrides": overrides, "target_split": target_split, "tables": tables,
        "gain": gain, "vs_baseline": versus, f"{args.method}_gain_ci_low": gain["ci_low"],
        f"{args.method}_vs_baseline_ci_low": versus[target_split]["ci_low"], **run,
    })


def comparison(table: dict[str, Any], name: str, metric: str) -> dict[str, Any]:
    found = next((c for c in table["comparisons"] if c["name"] == name and c["metric"] == metric), None)
    if found is None:
        raise SystemExit(f"no {name!r} comparison on {metric} in the final table ({table['split']})")
    return found


def vague_table(method: str, params: Params) -> dict[str, Any]:
    """The final table on the vague split: the same trained phases and baselines, read on the vague
    copies of the test queries (steps of their own: the test split's stamps are kept)."""
    from coevo.orchestration.pipeline import Pipeline

    on_vague = params.model_copy(update={"evaluation": params.evaluation.model_copy(update={"split": "vague"})})
    pipe = Pipeline(method, on_vague)
    baselines = {step.name.split("-")[1]: step.run() for step in pipe.baseline_steps()}
    return pipe.table(pipe.final().run(), baselines)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
