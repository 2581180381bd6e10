"""What every method is: phases in order over one run directory, their keys, early stopping.

A method declares its phases (:class:`Phase`: name, the params subtree it depends on, the
phases it reads, the run-dir paths it writes) and implements ``_run(phase)``. The base class
supplies everything else, the same way for CoGR, GRAPE and CoHyDE:

- ``key(name)``: the phase's staleness key (``coevo.steps``: data fingerprint + params
  subtree + keys of the phases it reads + library code);
- ``run_phase(name)`` / ``is_done(name)``: a phase re-runs iff its key changed or an output
  vanished; its result is stored with the key (a stamp), so a killed run resumes at the
  last finished phase and a changed knob re-runs exactly the phases that depend on it;
- ``prune()``: removes the outputs of phases whose key changed or that left the plan (a
  lower ``rounds``), so the run directory (a DVC output) never holds stale phases;
- numerics (``coevo.runtime.numerics``): every phase trains under ``runtime.precision``, its
  stamp records the numerics it ran with, and a run folder whose finished phases were trained
  under another resolved precision or CPU ISA is not continued (:class:`NumericsMismatch`);
  the numerics are no part of any key, so stamps without them (older runs) still count;
- early stopping on the val split, ``best_phase()``, ``rows()`` for tables, and ``run()``
  for in-process training (``coevo train``), which the Prefect flow mirrors task by task.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from coevo import distributed
from coevo.config import Params
from coevo.runtime import BF16_RESUME_NUMERICS, RESUME_NUMERICS, describe_numerics, numerics, precision_policy
from coevo.steps import code_hash, fingerprint, is_done, read_stamp, remove_outputs, run_stamped, select, step_key

if TYPE_CHECKING:
    from coevo.config import EarlyStoppingSection

log = logging.getLogger(__name__)

MONITOR_SPLIT = "val"  # early stopping and phase selection never look at the test split
STAMPS = "stamps"


@dataclass(frozen=True)
class Phase:
    """One phase of a method: what it depends on and what it writes (relative to the run dir)."""

    name: str
    label: str
    params: tuple[str, ...]
    writes: tuple[str, ...]
    reads: tuple[str, ...] = ()
    monitored: bool = False   # its val evaluation enters early stopping and phase selection
    stoppable: bool = False   # early stopping may skip it
    resumable: bool = False   # partial outputs of an interrupted attempt (same key) are reused


@dataclass(frozen=True)
class EarlyStop:
    metric: str
    best: float
    best_index: int
    stale: int
    stop: bool


def early_stopping(values: Sequence[float], metric: str, patience: int, min_delta: float) -> EarlyStop:
    """Best value so far and how many evaluations since it improved by more than ``min_delta``."""
    best, best_index, stale = float("-inf"), -1, 0
    for i, value in enumerate(values):
        if value > best + min_delta:
            best, best_index, stale = float(value), i, 0
        else:
            stale += 1
    return EarlyStop(metric, best, best_index, stale, stale >= patience)


class PhaseNotReady(RuntimeError):
    """A phase was asked to run before a phase it reads has finished."""


class NumericsMismatch(ValueError):
    """A run folder holds phases trained under other numerics than this machine resolves now."""


class Method(ABC):
    """A method's run over ``run_dir`` on the prepared data set in ``dataset_dir``."""

    name: ClassVar[str]
    title: ClassVar[str]
    #: library modules whose source is part of every phase key (and the DVC train deps)
    code: ClassVar[tuple[str, ...]]
    #: metrics shown in the flow's final table
    table_metrics: ClassVar[tuple[str, ...]]
    # The baseline the method's paper claims to beat: a retrieval baseline's name ("bm25", "dense": at its
    # F1@k with k chosen on val; CoGR: BM25) or a phase of final_evaluation's rows (GRAPE: the raw query,
    # CoHyDE: S1a); None = the best BM25/dense baseline on val. Every final table compares with it.
    paper_baseline: ClassVar[str | None] = None
    #: knobs that decide which phases exist or run (not part of any phase key; DVC tracks them)
    plan_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self, run_dir: str | Path, params: Params, dataset_dir: str | Path, *, progress: bool = False,
                 data_fingerprint: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.params = params
        self.seed = params.seed
        self.dataset_dir = Path(dataset_dir)
        self.progress = progress
        self._data_fingerprint = data_fingerprint
        self._dataset = None
        self.cfg = getattr(params, self.name)  # the method's own params section

    @classmethod
    def declared(cls, params: Params) -> "Method":
        """An instance that knows only its params: enough for :meth:`phases` (no data is read)."""
        probe = cls.__new__(cls)
        Method.__init__(probe, ".", params, ".", data_fingerprint="-")
        return probe

    # ------------------------------------------------------------ to implement
    @abstractmethod
    def phases(self) -> list[Phase]:
        """Every phase of the current params, in order."""

    @abstractmethod
    def _run(self, phase: Phase) -> dict[str, Any]:
        """Run one phase (its inputs are done); return a JSON-able record. A monitored phase's
        record holds ``eval``: its metrics on the val split."""

    @abstractmethod
    def final_evaluation(self, split: str) -> dict[str, Any]:
        """Evaluate the start and the chosen phase on ``split`` (read once): {"rows": [...]}."""

    @abstractmethod
    def write_reports(self, metrics_file: Path, plots_csv: Path, report_dir: Path, final: Mapping[str, Any],
                      baselines: Mapping[str, Any]) -> list[str]:
        """metrics.json, the per-phase CSV for `dvc plots`, plots and examples; returns the files."""

    def tracking_series(self) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) pairs for the tracker: learning curves per phase or training step."""
        return [(i, _flat_numbers(record)) for i, record in enumerate(self.rows())]

    def training_curve(self) -> list[dict[str, Any]]:
        """The per-step GRPO values of the finished phases (``coevo.train.grpo.learning_curve``),
        one row per step: {"phase", "global_step" (counted across phases, in order), values...}."""
        rows: list[dict[str, Any]] = []
        offset = 0
        for phase in self._plan.values():
            if not self.is_done(phase.name):
                continue
            record = self.result(phase.name)
            train = record.get("train") if isinstance(record.get("train"), Mapping) else record
            curve = train.get("curve") or []
            for point in curve:
                rows.append({"phase": phase.name, "global_step": offset + int(point["step"]),
                             **{k: v for k, v in point.items() if k != "step"}})
            offset += int(max((p["step"] for p in curve), default=0))
        return rows

    def training_curve_series(self) -> list[tuple[int, dict[str, float]]]:
        """:meth:`training_curve` as (global step, {"grpo/<value>": ...}) pairs for the tracker."""
        return [(point["global_step"], {f"grpo/{k}": v for k, v in point.items() if k not in ("phase", "global_step")})
                for point in self.training_curve()]

    def exports(self, index_dir: Path, final: Mapping[str, Any]) -> dict[str, Any]:
        """Artifacts for other tools (CoGR: a Lucene index); none by default."""
        return {}

    @property
    def early_stopping_params(self) -> EarlyStoppingSection | None:
        """The method's early-stopping section, or None when it has none."""
        return None

    # --------------------------------------------------------------- data
    @property
    def dataset(self):
        if self._dataset is None:
            from coevo.data.schema import Dataset

            self._dataset = Dataset.load(self.dataset_dir)
        return self._dataset

    @property
    def data_fingerprint(self) -> str:
        if self._data_fingerprint is None:
            self._data_fingerprint = fingerprint(self.dataset_dir)
        return self._data_fingerprint

    def require_val(self) -> None:
        """Early stopping and phase selection need held-out val queries with relevant items."""
        if not self.dataset.relevant(MONITOR_SPLIT):
            raise ValueError(
                f"{self.dataset_dir}: no val query has a relevant item; {self.name} monitors training on the val "
                "split only (never on test). Prepare the data set with a val split (data.val_fraction > 0)."
            )

    # --------------------------------------------------------------- keys
    @functools.cached_property
    def _plan(self) -> dict[str, Phase]:
        phases = self.phases()
        names = [p.name for p in phases]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate phase names {names}")
        return {p.name: p for p in phases}

    def phase(self, name: str) -> Phase:
        try:
            return self._plan[name]
        except KeyError:
            raise ValueError(f"{self.name}: unknown phase {name!r}; phases: {', '.join(self._plan)}") from None

    @functools.cached_property
    def code_hash(self) -> str:
        return code_hash(tuple(self.code))

    def key(self, name: str) -> str:
        """The phase's staleness key (see coevo.steps); memoised, params never change in a run."""
        keys = self.__dict__.setdefault("_keys", {})
        if name not in keys:
            phase = self.phase(name)
            params = select(self.params.model_dump(mode="json"), phase.params)
            inputs = [self.data_fingerprint] + [self.key(r) for r in phase.reads]
            keys[name] = step_key(f"{self.name}:{name}", params, inputs, self.code_hash)
        return keys[name]

    def _stamp(self, name: str) -> Path:
        return self.run_dir / STAMPS / f"{name}.json"

    def _outputs(self, phase: Phase) -> list[Path]:
        return [self.run_dir / w for w in phase.writes]

    def is_done(self, name: str) -> bool:
        phase = self.phase(name)
        return is_done(self._stamp(name), self.key(name), self._outputs(phase))

    def result(self, name: str) -> dict[str, Any]:
        if not self.is_done(name):
            raise PhaseNotReady(f"{self.run_dir}: {self.name} phase {name} has not finished")
        return read_stamp(self._stamp(name))["result"]

    def numerics_of(self, name: str) -> dict[str, str] | None:
        """The numerics phase ``name`` was trained with (its stamp), None for stamps written before they were
        recorded; metrics.json and the reports can cite the chosen phase's (``numerics_of(best_phase())``)."""
        stamp = read_stamp(self._stamp(name)) or {}
        recorded = stamp.get("numerics")
        return dict(recorded) if isinstance(recorded, Mapping) else None

    # --------------------------------------------------------------- running
    def run_phase(self, name: str) -> dict[str, Any]:
        """Run one phase unless it is done with its current key; return its record."""
        phase = self.phase(name)
        self.require_val()  # before any work: every method monitors and selects on val
        for needed in phase.reads:
            if not self.is_done(needed):
                raise PhaseNotReady(
                    f"{self.name} phase {name} reads phase {needed}, which has not finished; run the phases in order "
                    f"(`coevo train {self.name}` or `coevo run {self.name}`)"
                )
        current = numerics(self.params)
        if not self.is_done(name):
            self.check_numerics(current)
        self.run_dir.mkdir(parents=True, exist_ok=True)

        def work() -> dict[str, Any]:
            result = self._run(phase)
            # The phase's models set torch's thread count (coevo.runtime.limit_cpu_threads): the done
            # stamp records the count it trained with, not the one before its first model existed.
            current["torch_threads"] = numerics(self.params)["torch_threads"]
            return result

        with precision_policy(self.params):
            return run_stamped(self._stamp(name), self.key(name), self._outputs(phase), work,
                               resumable=phase.resumable, meta={"writes": list(phase.writes), "numerics": current})

    def check_numerics(self, current: Mapping[str, str]) -> None:
        """Refuse to add to a run folder whose finished phases were trained under other numerics
        (resolved precision, CPU ISA, oneDNN's ISA cap; for bf16 phases the bf16 units) than ``current``;
        stamps without numerics pass."""
        for phase in self._plan.values():
            if not self.is_done(phase.name):
                continue
            recorded = (read_stamp(self._stamp(phase.name)) or {}).get("numerics")
            if not isinstance(recorded, Mapping):
                continue
            # a key an older stamp lacks is not compared (bf16_units arrived after the others)
            keys = RESUME_NUMERICS + (BF16_RESUME_NUMERICS if recorded.get("precision") == "bf16" else ())
            differ = [k for k in keys if k in recorded and str(recorded[k]) != str(current.get(k, ""))]
            if not differ:
                continue
            if "precision" in differ:
                fix = f"set runtime.precision={recorded.get('precision')}"
            else:
                names = {"cpu_isa": "CPU ISA", "bf16_units": "bf16 units", "onednn_max_cpu_isa": "ONEDNN_MAX_CPU_ISA setting"}
                fix = "run on a machine with the same " + " and ".join(names[k] for k in differ)
            raise NumericsMismatch(
                f"run folder {self.run_dir}: phase {phase.name} was trained with {describe_numerics(recorded)}; "
                f"this machine resolves {describe_numerics(current)}: use a fresh run folder or {fix}"
            )

    def prune(self) -> list[str]:
        """Remove the outputs and stamps of phases whose key changed or that left the plan."""
        removed = []
        folder = self.run_dir / STAMPS
        for stamp_path in sorted(folder.glob("*.json")) if folder.exists() else []:
            name = stamp_path.stem
            stamp = read_stamp(stamp_path) or {}
            if name in self._plan and stamp.get("key") == self.key(name):
                continue
            writes = self._plan[name].writes if name in self._plan else stamp.get("writes", ())
            remove_outputs([self.run_dir / w for w in writes])
            if distributed.is_writer():
                stamp_path.unlink(missing_ok=True)
            removed.append(name)
        distributed.barrier()  # every rank reads the stamps rank 0 kept
        if removed:
            log.info("%s: params, data or code changed: recomputing %s", self.name, ", ".join(removed))
        return removed

    def stop_before(self, name: str) -> EarlyStop | None:
        """The early-stopping decision that skips phase ``name`` (None: run it)."""
        if not self.phase(name).stoppable or self.early_stopping_params is None:
            return None
        state = self.early_stop()
        return state if state and state.stop else None

    def early_stop(self) -> EarlyStop | None:
        es = self.early_stopping_params
        rows = [r for r in self._monitored_records()]
        if es is None or not rows:
            return None
        return early_stopping([r["eval"][es.metric] for _, r in rows], es.metric, es.patience, es.min_delta)

    def _monitored_records(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for phase in self._plan.values():
            if phase.monitored:
                if not self.is_done(phase.name):
                    break
                out.append((phase.name, self.result(phase.name)))
        return out

    def best_phase(self) -> str:
        """The monitored phase with the best val metric (the last finished phase without one)."""
        state = self.early_stop()
        if state is not None:
            return self._monitored_records()[state.best_index][0]
        done = [p.name for p in self._plan.values() if self.is_done(p.name)]
        if not done:
            raise PhaseNotReady(f"{self.run_dir}: no finished {self.name} phase; run the train stage first")
        return done[-1]

    def pending(self) -> Iterator[Phase]:
        """The phases still to run, in order, stopping early when the monitor says so."""
        for phase in self._plan.values():
            stop = self.stop_before(phase.name)
            if stop is not None:
                self.say(f"early stopping before {phase.name}: {stop.metric} has not improved for {stop.stale} "
                         f"evaluation(s) (best {stop.best:.4f})")
                return
            yield phase

    def run(self, on_phase: Callable[[Phase, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Every phase in order with early stopping (resumes where it stopped); returns :meth:`rows`."""
        self.prune()
        for phase in self.pending():
            record = self.run_phase(phase.name)
            if on_phase is not None:
                on_phase(phase, record)
        return self.rows()

    def rows(self) -> list[dict[str, Any]]:
        """The records of the finished phases that evaluated something, in order."""
        out = []
        for phase in self._plan.values():
            if self.is_done(phase.name):
                record = self.result(phase.name)
                if "eval" in record:
                    out.append({"name": phase.name, "label": phase.label, **record})
        return out

    def say(self, message: str) -> None:
        log.info("%s: %s", self.name, message)
        if self.progress:
            from rich.console import Console

            Console(stderr=True).print(f"[cyan]{self.name}[/] {message}", highlight=False)


def _flat_numbers(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, Mapping):
            out.update(_flat_numbers(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


def method_class(name: str) -> type[Method]:
    """The Method class for ``cogr``, ``grape`` or ``cohyde``."""
    from coevo.methods import METHODS

    try:
        return METHODS[name]()
    except KeyError:
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(METHODS)}") from None
