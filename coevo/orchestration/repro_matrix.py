"""The expected-score matrix (``repro/expected.yaml``): data set x system x metric -> expected value.

In the spirit of pyserini's reproducibility pages: each entry names a data set (a committed
sample or a set under ``../shared/data``), a system (a baseline, or a method's pipeline with
a tiny model), the command a person runs to see the same figures, and per metric the
expected value and its tolerance. The values are written by :func:`record` from real runs
(``coevo repro record``), never by hand; :func:`check` (``coevo repro check [--slow]``) runs
the entries again and reports each figure as matched or failed, with the difference.

Tiers: ``fast`` entries use the committed samples (CI runs them on every push, in well under
a minute: both baselines on both samples and the tiny-model CoGR pipeline); ``slow`` entries
use the full sets in ``../shared/data``, or train the real small models (SmolLM2-135M,
MiniLM) on a sample (``--slow`` adds them; an entry whose source folder is absent is reported
as skipped, not as passed). An entry that trains real models names its ``numerics`` (bf16
or fp32): its figures hold for that numerics only, and a machine that trains in the other is
not checked against them (skipped, and said so).

How each system is run, in-process, with exactly the library calls its ``command`` makes:

- ``bm25`` / ``dense`` (``kind: baseline``): :func:`coevo.baselines.baseline_table` with the
  CLI's defaults (k for F1@k chosen on val, reported on test, 2,000 bootstrap resamples,
  seed 0) on the data set prepared with params.yaml's ``seed`` and split fractions (what
  ``coevo data prepare`` does by default).
- ``kind: pipeline``: the method's pipeline steps (prepare, the train phases, the final
  evaluation) under params.yaml plus the entry's ``set`` overrides, in a scratch project
  folder, with the same staleness keys as ``coevo run`` (validation, baselines and reports
  do not change the recorded figures and are skipped).

A figure matches when ``|got - expected| <= tolerance``. :func:`record` runs every selected
entry ``runs`` times (default 2) and refuses to write figures that differ between runs by
more than their tolerance: a figure is recorded only when it is reproducible here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # types only: the methods pull in pandas and the retrieval code
    from coevo.methods.cogr import CoGR

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # coevo/orchestration/ -> the repository root
EXPECTED = PROJECT_ROOT / "repro" / "expected.yaml"
TIERS = ("fast", "slow")
BASELINE_SYSTEMS = ("bm25", "dense")
NUMERICS = ("bf16", "fp32")
# How a bf16 CPU runs the kernels of a CPU without bf16 units (training then resolves to fp32).
FP32_HINT = "ONEDNN_MAX_CPU_ISA=AVX2 runs the fp32 machine's kernels on a bf16 CPU"


@dataclass(frozen=True)
class Entry:
    """One row group of the matrix: a system on a data set, and its expected figures."""

    dataset: str
    system: str
    tier: str
    command: str
    metrics: dict[str, dict[str, Any]]  # name -> {"expected": float | None, "tolerance": float}
    numerics: str | None = None  # bf16 | fp32: figures of a training run hold for one numerics only

    @property
    def id(self) -> str:
        return f"{self.dataset}/{self.system}" + (f"@{self.numerics}" if self.numerics else "")


@dataclass(frozen=True)
class Outcome:
    """One figure of one entry after a run."""

    entry: str
    metric: str
    expected: float | None
    got: float | None
    tolerance: float
    status: str  # matched | failed | missing | skipped | unrecorded
    note: str = ""

    @property
    def difference(self) -> float | None:
        if self.expected is None or self.got is None:
            return None
        return self.got - self.expected


@dataclass
class Matrix:
    """The parsed ``expected.yaml``."""

    path: Path
    doc: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)

    def dataset(self, name: str) -> dict[str, Any]:
        try:
            return self.doc["datasets"][name]
        except KeyError:
            raise ValueError(f"{self.path}: entry uses data set {name!r}, which `datasets:` does not declare") from None

    def system(self, name: str) -> dict[str, Any]:
        try:
            return self.doc["systems"][name]
        except KeyError:
            raise ValueError(f"{self.path}: entry uses system {name!r}, which `systems:` does not declare") from None

    def select(self, slow: bool = False, only: Sequence[str] = ()) -> list[Entry]:
        """Fast entries (and slow ones with ``slow``), filtered by ``only`` globs on ``dataset/system``."""
        tiers = TIERS if slow else ("fast",)
        chosen = [e for e in self.entries if e.tier in tiers]
        if only:
            chosen = [e for e in chosen if any(fnmatch(e.id, pattern) for pattern in only)]
        return chosen


def load(path: str | Path = EXPECTED) -> Matrix:
    """Read and check the matrix file (one-line errors naming the entry)."""
    path = Path(path)
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or not {"datasets", "systems", "entries"} <= set(doc):
        raise ValueError(f"{path}: expected mappings `datasets`, `systems` and a list `entries`")
    matrix = Matrix(path, doc)
    for i, raw in enumerate(doc["entries"] or []):
        where = f"{path}: entries[{i}]"
        try:
            dataset, system = raw["dataset"], raw["system"]
        except (KeyError, TypeError):
            raise ValueError(f"{where}: needs `dataset` and `system`") from None
        info = matrix.dataset(dataset)
        matrix.system(system)
        tier = raw.get("tier", info.get("tier", "fast"))  # an entry may be slower than its data set
        if tier not in TIERS:
            raise ValueError(f"{where} ({dataset}/{system}): tier {tier!r}; expected fast or slow")
        metrics = {}
        for name, spec in (raw.get("metrics") or {}).items():
            spec = spec or {}
            expected = spec.get("expected")
            tolerance = spec.get("tolerance")
            if tolerance is None or float(tolerance) < 0:
                raise ValueError(f"{where} ({dataset}/{system}), metric {name!r}: needs a tolerance >= 0")
            metrics[str(name)] = {"expected": None if expected is None else float(expected),
                                  "tolerance": float(tolerance)}
        if not metrics:
            raise ValueError(f"{where} ({dataset}/{system}): lists no metric")
        numerics = raw.get("numerics")
        if numerics is not None and numerics not in NUMERICS:
            raise ValueError(f"{where} ({dataset}/{system}): numerics {numerics!r}; expected one of {', '.join(NUMERICS)}")
        matrix.entries.append(Entry(dataset, system, tier, str(raw.get("command", "")), metrics, numerics))
    ids = [e.id for e in matrix.entries]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: an entry is listed twice ({sorted({i for i in ids if ids.count(i) > 1})})")
    return matrix


# ----------------------------------------------------------------------------- running
class Runner:
    """Runs entries, preparing each data set once in a scratch folder."""

    def __init__(self, matrix: Matrix, workdir: Path, say: Callable[[str], None] = lambda _m: None) -> None:
        self.matrix = matrix
        self.workdir = workdir
        self.say = say
        self._prepared: dict[str, Path] = {}
        self._params = _project_params()

    def source(self, dataset: str) -> Path:
        info = self.matrix.dataset(dataset)
        path = Path(info["source"])
        return path if path.is_absolute() else (PROJECT_ROOT / path).resolve()

    def prepared(self, dataset: str) -> Path:
        if dataset not in self._prepared:
            from coevo.data.loaders import load_source

            info, data = self.matrix.dataset(dataset), self._params.data
            out = self.workdir / "processed" / dataset
            load_source(info["loader"], str(self.source(dataset)), seed=self._params.seed, val_fraction=data.val_fraction,
                        test_fraction=data.test_fraction, name=dataset, **(info.get("options") or {})).save(out)
            self._prepared[dataset] = out
        return self._prepared[dataset]

    def run(self, entry: Entry) -> dict[str, float]:
        system = self.matrix.system(entry.system)
        kind = system.get("kind")
        if kind == "baseline":
            return baseline_figures(self.prepared(entry.dataset), entry.system)
        if kind == "pipeline":
            info = self.matrix.dataset(entry.dataset)
            return pipeline_figures(system["method"], entry.dataset, info["loader"], self.source(entry.dataset),
                                    list(system.get("set") or []), self.workdir / "projects" / entry.id,
                                    overlays=[PROJECT_ROOT / p for p in system.get("params") or []])
        raise ValueError(f"{self.matrix.path}: system {entry.system!r} has kind {kind!r}; expected baseline or pipeline")


def _project_params():
    from coevo.config import PROJECT_PARAMS, load_params

    return load_params([PROJECT_PARAMS])


def baseline_figures(data_dir: Path, system: str) -> dict[str, float]:
    """What `coevo baseline <system> DATA_DIR` prints, as figures: n, k*, F1@k* with its CI,
    P@1, NDCG@5/@10, R@10/@100 on test (k chosen on val)."""
    from coevo.baselines import baseline_table
    from coevo.data.schema import Dataset

    table = baseline_table(Dataset.load(data_dir), system, split="test", val_split="val")
    f1 = table.metrics[table.chosen_metric]
    out = {"n_queries": float(table.n_queries), "chosen_k": float(table.chosen_k), "f1@k*": f1.mean,
           "f1@k*.ci_low": f1.ci_low, "f1@k*.ci_high": f1.ci_high}
    for name in ("precision@1", "ndcg@5", "ndcg@10", "recall@10", "recall@100"):
        out[name] = table.metrics[name].mean
    return out


@contextlib.contextmanager
def _inside(folder: Path) -> Iterator[None]:
    previous = Path.cwd()
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def pipeline_figures(method: str, dataset: str, loader: str, source: Path, overrides: list[str],
                     project: Path, overlays: Sequence[Path] = ()) -> dict[str, float]:
    """A method's pipeline (prepare, train phases, final evaluation) in a scratch project,
    as figures: per phase its val metrics and training figures, the start and the chosen
    phase on test."""
    from coevo.config import PROJECT_PARAMS, load_params
    from coevo.orchestration.pipeline import Pipeline
    from coevo.report import numbers

    # data.root is relative to the scratch project, the working directory of the steps below.
    sets = [f"data.dataset={dataset}", f"data.loader={loader}", f"data.source={source}", "data.root=data",
            *overrides]
    params = load_params([PROJECT_PARAMS, *overlays], sets)
    with _inside(project):
        pipe = Pipeline(method, params)
        pipe.prepare().run()
        for step in pipe.train_steps():
            step.run()
        final = pipe.final().run()
        run = pipe.method
        out: dict[str, float] = {}
        for phase in run.phases():
            if not run.is_done(phase.name):
                continue
            record = run.result(phase.name)
            for name, value in numbers(record.get("eval") or {}).items():
                out[f"val/{phase.name}/{name}"] = value
            for name, value in numbers(record.get("train") or {}).items():
                out[f"train/{phase.name}/{name}"] = value
            for name, value in _written_records(run.run_dir, phase.writes).items():
                out[f"train/{phase.name}/{name}"] = value
            if "eval" not in record:
                for name, value in numbers(record).items():
                    out[f"{phase.name}/{name}"] = value
        rows = final["rows"]
        start = next(r for r in rows if r["phase"] == final.get("start_phase", rows[0]["phase"]))
        best = [r for r in rows if r["phase"] == final["best_phase"]][-1]
        for role, row in (("start", start), ("final", best)):
            for name, value in numbers(row).items():
                out[f"{final['split']}/{role}/{name}"] = value
        out["best_phase_index"] = float([p.name for p in run.phases()].index(final["best_phase"]))
        probe = REWARD_PROBES.get(method)
        if probe is not None:
            out.update(probe(run))
    return out


def cogr_seed_rewards(run: CoGR) -> dict[str, float]:
    """CoGR's two training rewards applied to fixed sets, its Algorithm 1 targets (what SFT teaches
    each side to write): the query reward (set F1) of each train query's S_q against the index of
    every S_i, and the item reward of an empty set for each item against the index of every S_q
    (the summed F1 change of the queries it touches when that item loses its S_i).

    The phases' figures can miss a broken reward at the matrix's scale (a sampled set that meets
    the right tool is rare, so recall instead of F1 moves a GRPO reward mean by one completion's
    worth); these two score fixed sets with the very classes GRPO calls, so a change of either
    reward moves them. With extractive (YAKE) seeds they are the same on every machine."""
    import statistics

    from coevo.retrieval.inverted_index import InvertedIndex
    from coevo.rewards.cogr import ItemReward, QueryReward

    if not run.is_done("seed"):
        return {}
    items, queries = run.seed_targets()
    qrels, k_max = run.train_qrels, run.cfg.k_max
    query_ids = [q for q in queries if q in qrels]
    query = QueryReward(InvertedIndex.from_keyword_sets(items), qrels, k_max).score_keywords(
        query_ids, [queries[q] for q in query_ids])
    item_ids = list(items)
    item = ItemReward({q: queries[q] for q in query_ids}, items, qrels, k_max, mode=run.cfg.item_reward).score_keywords(
        item_ids, [[] for _ in item_ids])
    return {"seed/query_reward_of_targets": statistics.fmean(query),
            "seed/item_reward_of_empty_sets": statistics.fmean(item)}


# Per method: figures that apply its training rewards to fixed inputs of the finished run.
REWARD_PROBES: dict[str, Callable[[Any], dict[str, float]]] = {"cogr": cogr_seed_rewards}


MAX_RECORD_BYTES = 1_000_000  # a training record is small; larger JSON files hold samples or keyword sets
MODEL_FOLDER_MARKERS = ("config.json", "generator.json", "manifest.json")  # an HF model, a coevo generator, an index


def _written_records(run_dir: Path, writes: Sequence[str]) -> dict[str, float]:
    """The numbers of the JSON records a phase wrote: its JSON outputs (CoHyDE's ``round_1/dpo.json``,
    ``round_1/s3.json``: DPO pairs, reward accuracy, encoder loss) and those directly in its output
    folders (``s1a/s1a.json``), named ``<file stem>/<path>``; model folders below them are not read."""
    import json

    out: dict[str, float] = {}
    for output in (run_dir / w for w in writes if not w.startswith("eval/")):  # evaluations are the val/ figures
        if output.is_dir():  # a model's or an index's own folder (its config, its manifest) holds no training record
            is_model = any((output / marker).exists() for marker in MODEL_FOLDER_MARKERS)
            files = [] if is_model else sorted(output.glob("*.json"))
        else:
            files = [output] if output.suffix == ".json" else []
        for file in files:
            if not file.is_file():
                continue
            if file.stat().st_size > MAX_RECORD_BYTES:
                continue
            record = json.loads(file.read_text())
            if isinstance(record, Mapping):
                out.update(_nested_numbers(record, f"{file.stem}/"))
    return out


def _nested_numbers(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a nested record, named by their path (``sft/loss``); lists are skipped."""
    from coevo.report import numbers

    out = {f"{prefix}{name}": value for name, value in numbers(record).items()}
    for key, part in record.items():
        if isinstance(part, Mapping):
            out.update(_nested_numbers(part, f"{prefix}{key}/"))
    return out


# ------------------------------------------------------------------------------ verdicts
def compare(entry: Entry, figures: Mapping[str, float]) -> list[Outcome]:
    out = []
    for name, spec in entry.metrics.items():
        expected, tol = spec["expected"], spec["tolerance"]
        got = figures.get(name)
        if got is None:
            out.append(Outcome(entry.id, name, expected, None, tol, "missing", "the run did not produce this figure"))
        elif expected is None:
            out.append(Outcome(entry.id, name, None, got, tol, "unrecorded", "run `coevo repro record`"))
        else:
            ok = math.isfinite(got) and abs(got - expected) <= tol
            out.append(Outcome(entry.id, name, expected, got, tol, "matched" if ok else "failed"))
    return out


def _skip(entry: Entry, why: str) -> list[Outcome]:
    return [Outcome(entry.id, name, spec["expected"], None, spec["tolerance"], "skipped", why)
            for name, spec in entry.metrics.items()]


def check(path: str | Path = EXPECTED, *, slow: bool = False, only: Sequence[str] = (),
          say: Callable[[str], None] = lambda _m: None) -> list[Outcome]:
    """Run the selected entries and compare every figure with its expected value."""
    matrix = load(path)
    entries = matrix.select(slow, only)
    if not entries:
        raise ValueError(f"{matrix.path}: no entry matches (slow={slow}, only={list(only)})")
    here = local_numerics()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="coevo-repro-") as tmp:
        runner = Runner(matrix, Path(tmp), say)
        for entry in entries:
            if entry.numerics not in (None, here):
                outcomes += _skip(entry, f"its figures are {entry.numerics}'s; this machine trains in {here}")
                say(f"{entry.id}: skipped (this machine trains in {here})")
                continue
            if not runner.source(entry.dataset).exists():
                outcomes += _skip(entry, f"source {runner.source(entry.dataset)} is absent")
                say(f"{entry.id}: skipped (source absent)")
                continue
            started = time.perf_counter()
            figures = runner.run(entry)
            found = compare(entry, figures)
            units = units_note(matrix, entry)
            if units:  # a failure may be the CPU's bf16 kernels, not the code: say so beside each failed figure
                found = [dataclasses.replace(o, note=f"{o.note}; {units}" if o.note else units) if o.status == "failed"
                         else o for o in found]
            outcomes += found
            failed = sum(o.status != "matched" for o in found)
            say(f"{entry.id}: {len(found) - failed}/{len(found)} matched ({time.perf_counter() - started:.1f}s)"
                + (f"; {units}" if failed and units else ""))
    return outcomes


def record(path: str | Path = EXPECTED, *, slow: bool = False, only: Sequence[str] = (), runs: int = 2,
           vary_threads: bool = False, say: Callable[[str], None] = lambda _m: None) -> dict[str, dict[str, float]]:
    """Run the selected entries ``runs`` times and write their figures as expected values.

    Tolerances and commands stay as the file has them. A figure that differs between the
    runs by more than its tolerance is not written (an error names it): only what is
    reproducible here becomes an expectation. ``vary_threads``: run k uses k torch threads,
    so the runs also differ in summation order, as another CPU's kernels do (the tolerances
    must cover that). Returns {entry id: {metric: value}}.
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    matrix = load(path)
    entries = matrix.select(slow, only)
    if not entries:
        raise ValueError(f"{matrix.path}: no entry matches (slow={slow}, only={list(only)})")
    changes = uncommitted_changes(matrix.path)
    if changes:
        raise ValueError(f"record stamps the commit its figures come from; commit first (uncommitted: "
                         f"{', '.join(changes[:5])}{', ...' if len(changes) > 5 else ''})")
    commit = _git_commit()  # taken now: a commit made while the entries run is not what ran
    here = local_numerics()
    elsewhere = [e for e in entries if e.numerics not in (None, here)]
    if elsewhere and only:
        how = FP32_HINT if elsewhere[0].numerics == "fp32" else "record it on a CPU with bf16 units (AVX512-BF16/AMX)"
        raise ValueError(f"{elsewhere[0].id}: its figures are {elsewhere[0].numerics}'s and this machine trains in "
                         f"{here}; {how}")
    for entry in elsewhere:
        say(f"{entry.id}: left as it is (this machine trains in {here})")
    entries = [e for e in entries if e not in elsewhere]
    recorded: dict[str, dict[str, float]] = {}
    unstable: dict[str, list[str]] = {}
    for attempt in range(runs):
        with tempfile.TemporaryDirectory(prefix="coevo-repro-") as tmp, _torch_threads(attempt + 1 if vary_threads else None):
            runner = Runner(matrix, Path(tmp), say)
            for entry in entries:
                if not runner.source(entry.dataset).exists():
                    raise FileNotFoundError(f"{entry.id}: source {runner.source(entry.dataset)} is absent; "
                                            "cannot record it")
                started = time.perf_counter()
                figures = runner.run(entry)
                say(f"run {attempt + 1}/{runs}: {entry.id} ({time.perf_counter() - started:.1f}s)")
                missing = [m for m in entry.metrics if m not in figures]
                if missing:
                    raise ValueError(f"{entry.id}: the run produced no figure named {', '.join(missing)}"
                                     + _closest(missing, figures))
                if attempt == 0:
                    recorded[entry.id] = {m: figures[m] for m in entry.metrics}
                    continue
                for m in entry.metrics:
                    if abs(figures[m] - recorded[entry.id][m]) > entry.metrics[m]["tolerance"]:
                        unstable.setdefault(entry.id, []).append(f"{m}: {recorded[entry.id][m]!r} then {figures[m]!r}")
                say(_spread_line(entry, recorded[entry.id], figures))
    # Entries that reproduced are written even when another did not: their runs are not wasted.
    stable = {key: figures for key, figures in recorded.items() if key not in unstable}
    if stable:
        # The file as it is now: another record (of other entries) may have written it meanwhile.
        matrix = load(matrix.path)
        for raw in matrix.doc["entries"]:
            key = f"{raw['dataset']}/{raw['system']}" + (f"@{raw['numerics']}" if raw.get("numerics") else "")
            if key in stable:
                for name, value in stable[key].items():
                    if name in raw["metrics"]:
                        raw["metrics"][name]["expected"] = _rounded(value)
        _write(matrix, stable, commit, runs=runs, vary_threads=vary_threads)
    if unstable:
        raise ValueError("figures differ between runs by more than their tolerance (not recorded"
                         + (f"; {len(stable)} other entries were" if stable else "") + "): "
                         + "; ".join(f"{key} {'; '.join(diffs)}" for key, diffs in unstable.items()))
    return stable


def _spread_line(entry: Entry, first: Mapping[str, float], again: Mapping[str, float]) -> str:
    """How far a repeat run moved the entry's figures, the largest move against its tolerance first:
    what a tolerance must cover, measured."""
    moves = sorted(((abs(again[m] - first[m]), m) for m in entry.metrics),
                   key=lambda dm: dm[0] / max(entry.metrics[dm[1]]["tolerance"], 1e-12), reverse=True)
    moved = [f"{m} {d:.3g} (tolerance {entry.metrics[m]['tolerance']:g})" for d, m in moves if d > 0]
    return f"{entry.id}: " + (f"{len(moved)} of {len(moves)} figures moved; largest: {', '.join(moved[:3])}"
                              if moved else f"all {len(moves)} figures identical between runs")


@contextlib.contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    """``COEVO_THREADS=count`` inside the block (the thread policy reads it at every model load)."""
    from coevo.runtime import THREADS_ENV

    if count is None:
        yield
        return
    before = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = str(count)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = before


def _rounded(value: float) -> float:
    return float(f"{value:.10g}")


def _write(matrix: Matrix, recorded: Mapping[str, Any], commit: str, *, runs: int = 1,
           vary_threads: bool = False) -> None:
    """Rewrite the file: the header comment is kept, the YAML body regenerated."""
    from coevo.io import write_text

    text = matrix.path.read_text()
    header = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            header.append(line)
        else:
            break
    doc = matrix.doc
    doc.setdefault("recorded", {})
    from coevo.runtime import numerics

    stamp = {"date": time.strftime("%Y-%m-%d"), "git_commit": commit, "numerics": numerics(_project_params()),
             "runs": runs}
    if vary_threads:  # run k ran on k threads
        stamp["numerics"]["torch_threads"] = ",".join(str(k) for k in range(1, runs + 1))
    for key in recorded:
        doc["recorded"][key] = dict(stamp)
    body = yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True)
    write_text(matrix.path, "\n".join(header).rstrip() + "\n" + body)


def _git(*args: str) -> str:
    import subprocess

    try:
        return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValueError(f"record stamps the git commit of {PROJECT_ROOT}, and `git {' '.join(args)}` failed there: "
                         f"{getattr(exc, 'stderr', '') or exc}".strip()) from None


def _git_commit() -> str:
    return _git("rev-parse", "--short", "HEAD").strip()


def uncommitted_changes(matrix_path: Path) -> list[str]:
    """Tracked files of the project with uncommitted changes, the matrix file itself aside
    (record rewrites it, entry by entry)."""
    own = matrix_path.resolve()
    lines = _git("status", "--porcelain", "--untracked-files=no").splitlines()
    changed = [line[3:].split(" -> ")[-1] for line in lines if line.strip()]
    return [name for name in changed if (PROJECT_ROOT / name).resolve() != own]


def units_note(matrix: Matrix, entry: Entry) -> str:
    """For a bf16 entry recorded on other bf16 units than this CPU's (AMX against AVX512_BF16: other
    oneDNN kernels, other rounding), or stamped before the units were recorded: a note that says so;
    "" otherwise."""
    if entry.numerics != "bf16":
        return ""
    from coevo.runtime import cpu_bf16_units

    here = cpu_bf16_units()
    stamp = ((matrix.doc.get("recorded") or {}).get(entry.id) or {}).get("numerics") or {}
    there = stamp.get("bf16_units")
    if there == here:
        return ""
    if there is None:
        return f"recorded before bf16 units were stamped; this CPU has {here} (bf16 figures hold on the same units)"
    return f"recorded on {there} bf16 units; this CPU has {here} (bf16 figures hold on the same units)"


def local_numerics() -> str:
    """``bf16`` or ``fp32``: what training resolves to here under the project's params
    (``runtime.precision``; ``auto`` follows the CPU)."""
    from coevo.runtime import resolved_precision

    return resolved_precision(_project_params())


def _closest(missing: Sequence[str], figures: Mapping[str, float]) -> str:
    """`` (closest it produced: ...)`` for a misnamed figure, "" when nothing is close."""
    import difflib

    close = dict.fromkeys(c for m in missing for c in difflib.get_close_matches(m, list(figures), n=2, cutoff=0.6))
    return f" (closest it produced: {', '.join(close)})" if close else ""


def summary(outcomes: Sequence[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return counts


def passed(outcomes: Sequence[Outcome]) -> bool:
    """Every figure that ran matched (skipped entries do not fail a check; they are reported)."""
    return all(o.status in ("matched", "skipped") for o in outcomes) and any(o.status == "matched" for o in outcomes)
