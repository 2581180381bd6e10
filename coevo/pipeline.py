"""A method's pipeline as a chain of keyed steps: prepare -> validate -> train -> evaluate.

Each :class:`Step` carries its staleness key (``coevo.steps``), the library call that does
its work, and the library's own resume check. The Prefect flows wrap each step in one task
whose cache key is the step's key; ``coevo train`` runs the train steps in-process; the CLI
asks :meth:`Pipeline.up_to_date` whether anything would run before it starts Prefect at all.
Train steps are the method's phases; later steps' keys depend on earlier results (the data
fingerprint, the phase chosen on val), so steps are built stage by stage.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.config import Params
from coevo.layout import Layout
from coevo.methods.base import MONITOR_SPLIT, Method, method_class
from coevo.steps import code_hash, fingerprint, is_done, read_stamp, run_stamped, select, step_key

STAGES: tuple[str, ...] = ("prepare", "validate", "train", "evaluate")
ALL = "all"
STEPS_DIR = Path(".coevo") / "steps"  # stamps of the steps that are not method phases

PREPARE_CODE = ("coevo.data", "coevo.io")
VALIDATE_CODE = ("coevo.data.validation", "coevo.data.schema", "coevo.io")
BASELINE_CODE = ("coevo.retrieval", "coevo.data.schema", "coevo.io")
REPORT_CODE = ("coevo.report",)


@dataclass(frozen=True)
class Step:
    """One unit of work: a name (the Prefect task name), a key, the call, the resume check."""

    name: str
    label: str
    stage: str
    key: str
    run: Callable[[], dict[str, Any]] = field(repr=False, compare=False)
    done: Callable[[], bool] = field(repr=False, compare=False)


def check_stage(stage: str) -> str:
    if stage != ALL and stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join((ALL, *STAGES))}")
    return stage


def wants(stage: str, name: str) -> bool:
    return stage == ALL or stage == name


class Pipeline:
    """The steps of one method on the data set of ``params``."""

    def __init__(self, method: str, params: Params, *, progress: bool = False) -> None:
        self.params = params
        self.method_cls: type[Method] = method_class(method)
        self.layout = Layout.of(params, method)
        self.progress = progress
        self._dump = params.model_dump(mode="json")

    @property
    def name(self) -> str:
        return self.method_cls.name

    def _stamp(self, step: str, scope: str | None = None) -> Path:
        return STEPS_DIR / (scope or f"{self.name}/{self.layout.dataset}") / f"{step}.json"

    def _stamped(self, name: str, label: str, stage: str, key: str, outputs: list[Path],
                 work: Callable[[], dict[str, Any]], scope: str | None = None,
                 verify: Callable[[dict[str, Any]], bool] | None = None) -> Step:
        stamp = self._stamp(name, scope)

        def done() -> bool:
            if not is_done(stamp, key, outputs):
                return False
            return verify is None or verify(read_stamp(stamp)["result"])

        def run() -> dict[str, Any]:
            if not done():  # outputs changed under a matching key (a DVC checkout): redo
                stamp.unlink(missing_ok=True)
            return run_stamped(stamp, key, outputs, work)

        return Step(name, label, stage, key, run, done)

    # ------------------------------------------------------------------ data
    def prepare(self) -> Step:
        data = self.params.data
        out = self.layout.processed
        key = step_key("prepare", select(self._dump, ("seed", "data")), [fingerprint(data.source)],
                       code_hash(PREPARE_CODE))

        def work() -> dict[str, Any]:
            from coevo.data.loaders import load_source

            dataset = load_source(data.loader, data.source, seed=self.params.seed, val_fraction=data.val_fraction,
                                  test_fraction=data.test_fraction, name=data.dataset)
            dataset.save(out)
            return {"dataset_dir": str(out), "fingerprint": fingerprint(out), "counts": dataset.metadata()["counts"]}

        return self._stamped("prepare-data", "prepare data", "prepare", key, [out], work, scope=f"data/{data.dataset}",
                             verify=lambda result: result["fingerprint"] == fingerprint(out))

    def data_fingerprint(self) -> str:
        if not (self.layout.processed / "dataset.json").exists():
            raise FileNotFoundError(f"{self.layout.processed}: no prepared data set; run the prepare stage first "
                                    f"(`coevo run {self.name} --stage prepare` or `dvc repro prepare`)")
        return fingerprint(self.layout.processed)

    def validate(self) -> Step:
        report = self.layout.validation_report
        data_fp = self.data_fingerprint()
        key = step_key("validate", {}, [data_fp], code_hash(VALIDATE_CODE))

        def work() -> dict[str, Any]:
            from coevo.data.validation import ensure_valid

            ensure_valid(self.layout.processed, report)
            return {"report": str(report), "fingerprint": data_fp}

        return self._stamped("validate-data", "validate data", "validate", key, [report], work,
                             scope=f"data/{self.layout.dataset}")

    def require_validated(self) -> None:
        """A stage run on its own (DVC) needs the validation report of this data set."""
        if not (self.validate().done() or self.layout.validation_report.exists()):
            raise FileNotFoundError(f"{self.layout.validation_report}: the prepared data set has not been validated; "
                                    f"run the validate stage first (`coevo run {self.name} --stage validate`)")

    # ----------------------------------------------------------------- train
    @functools.cached_property
    def method(self) -> Method:
        return self.method_cls(self.layout.run_dir, self.params, self.layout.processed, progress=self.progress,
                               data_fingerprint=self.data_fingerprint())

    def phase_step(self, name: str) -> Step:
        method, phase = self.method, self.method.phase(name)
        return Step(f"{self.name}-{name}", phase.label, "train", method.key(name),
                    lambda: method.run_phase(name), lambda: method.is_done(name))

    def train_steps(self, prune: bool = True) -> Iterator[Step]:
        """The phases still to run, lazily: early stopping is decided after each one finishes."""
        if prune:
            self.method.prune()
        for phase in self.method.pending():
            yield self.phase_step(phase.name)

    def phase_count(self) -> int:
        return len(self.method_cls.declared(self.params).phases())

    # -------------------------------------------------------------- evaluate
    def baseline(self, split: str) -> Step:
        """Lucene BM25 over title + text on ``split``, scored with the project's metrics."""
        key = step_key("bm25", {"split": split}, [self.data_fingerprint()], code_hash(BASELINE_CODE))

        def work() -> dict[str, Any]:
            from coevo.retrieval.lucene import bm25_baseline

            metrics = bm25_baseline(self.method.dataset, split, 1000)
            return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}

        return self._stamped(f"bm25-{split}", f"BM25 baseline ({split})", "evaluate", key, [], work,
                             scope=f"data/{self.layout.dataset}")

    def baseline_steps(self) -> list[Step]:
        return [self.baseline(split) for split in dict.fromkeys((MONITOR_SPLIT, self.params.evaluation.split))]

    def final(self) -> Step:
        method = self.method
        trained = [p.name for p in method.phases() if method.is_done(p.name)]
        if not trained:
            raise FileNotFoundError(f"{self.layout.run_dir}: no finished {self.name} phase; run the train stage first")
        key = step_key(f"{self.name}:final", select(self._dump, ("evaluation",)), [method.key(p) for p in trained],
                       method.code_hash)
        split = self.params.evaluation.split
        return self._stamped(f"{self.name}-final", f"final evaluation ({split})", "evaluate", key, [],
                             lambda: method.final_evaluation(split))

    def export(self, final: Step) -> Step | None:
        """The method's exports for other tools (CoGR: Lucene), or None when it has none."""
        if type(self.method).exports is Method.exports:
            return None
        out = self.layout.index_dir
        return self._stamped(f"{self.name}-export", "export index", "evaluate", step_key("export", {}, [final.key],
                             self.method.code_hash), [out], lambda: self.method.exports(out, final.run()))

    def reports(self, final: Step, baselines: list[Step]) -> Step:
        lay = self.layout
        key = step_key(f"{self.name}:reports", {}, [final.key, *(b.key for b in baselines)],
                       code_hash(REPORT_CODE + tuple(self.method.code)))

        def work() -> dict[str, Any]:
            lay.report_dir.mkdir(parents=True, exist_ok=True)
            by_split = {b.name.split("-", 1)[1]: b.run() for b in baselines}
            files = self.method.write_reports(lay.metrics_file, lay.plots_csv, lay.report_dir, final.run(),
                                              {"bm25": by_split})
            return {"files": files}

        return self._stamped(f"{self.name}-reports", "reports", "evaluate", key,
                             [lay.metrics_file, lay.plots_csv, lay.report_dir], work)

    def evaluate_steps(self) -> list[Step]:
        baselines = self.baseline_steps()
        final = self.final()
        export = self.export(final)
        return [*baselines, final, *([export] if export else []), self.reports(final, baselines)]

    # --------------------------------------------------------------- planning
    def up_to_date(self, stage: str = ALL) -> bool:
        """True when no step of ``stage`` would run (checked without Prefect or any model)."""
        try:
            steps: list[Step] = []
            if wants(stage, "prepare"):
                steps.append(self.prepare())
                if not steps[-1].done():
                    return False
            if wants(stage, "validate"):
                steps.append(self.validate())
            if wants(stage, "train") and any(not s.done() for s in self.train_steps(prune=False)):
                return False
            if wants(stage, "evaluate"):
                steps.extend(self.evaluate_steps())
            return all(s.done() for s in steps)
        except (FileNotFoundError, ValueError):
            return False

    @property
    def summary_path(self) -> Path:
        return self._stamp("summary")

    def last_summary(self) -> dict[str, Any] | None:
        from coevo.io import read_json

        return read_json(self.summary_path) if self.summary_path.exists() else None
