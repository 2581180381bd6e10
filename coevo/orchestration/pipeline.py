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
from typing import Any, TYPE_CHECKING

from coevo.baselines import DEFAULT_ENCODER
from coevo.config import Params
from coevo.layout import Layout, write_run_params
from coevo.methods.base import MONITOR_SPLIT, Method, method_class
from coevo.retrieval.bm25 import BM25_B, BM25_K1
from coevo.steps import code_hash, fingerprint, is_done, read_stamp, run_stamped, select, step_key

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from coevo.data.schema import Dataset

STAGES: tuple[str, ...] = ("prepare", "validate", "train", "evaluate")
ALL = "all"
STEPS_DIR = Path(".coevo") / "steps"  # stamps of the steps that are not method phases

PREPARE_CODE = ("coevo.data", "coevo.io")
VALIDATE_CODE = ("coevo.data.validation", "coevo.data.schema", "coevo.io")
BASELINE_CODE = ("coevo.baselines", "coevo.retrieval", "coevo.stats", "coevo.models.encoder", "coevo.data.schema",
                 "coevo.io")
REPORT_CODE = ("coevo.report", "coevo.stats")

def exports_index(method_cls: type[Method]) -> bool:
    """Whether the method writes artifacts for other tools (``Method.exports``; CoGR: a Lucene index)."""
    return method_cls.exports is not Method.exports


# The reference retrievers of every final table (coevo.baselines), each with its one fixed
# parameter set: Lucene BM25 over title + text with Anserini's defaults (k1 0.9, b 0.4, the
# same values that rank CoGR's retrieved sets), and the offline MiniLM encoder with exact
# faiss search. Both retrieve to the largest evaluation cut-off.
BASELINES: dict[str, dict[str, Any]] = {
    "bm25": {"k1": BM25_K1, "b": BM25_B, "document": "title + ' ' + text"},
    "dense": {"encoder": DEFAULT_ENCODER, "document": "title: text"},
}
BASELINE_TITLES = {"bm25": "BM25", "dense": "dense"}
# Per-query values a baseline keeps on the final split, for paired comparisons ("f1" is F1@k*).
BASELINE_PER_QUERY: tuple[str, ...] = ("f1", "precision@1", "recall@1", "recall@5", "recall@10", "recall@100",
                                       "ndcg@5", "ndcg@10")


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

        def run() -> dict[str, Any]:  # outputs changed under a matching key (a DVC checkout): redone, with a notice
            return run_stamped(stamp, key, outputs, work, label=label, verify=verify)

        return Step(name, label, stage, key, run, done)

    # ------------------------------------------------------------------ data
    def prepare(self) -> Step:
        data = self.params.data
        out = self.layout.processed
        key = step_key("prepare", select(self._dump, ("seed", "data")), [fingerprint(data.source)],
                       code_hash(PREPARE_CODE))

        def work() -> dict[str, Any]:
            from coevo.data.loaders import load_source
            from coevo.data.vague import with_vague

            dataset = load_source(data.loader, data.source, seed=self.params.seed, val_fraction=data.val_fraction,
                                  test_fraction=data.test_fraction, name=data.dataset, min_grade=data.min_grade,
                                  split_scheme=data.split_scheme, duplicates=data.duplicates)
            dataset = with_vague(dataset, data.vague)
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

    def record_params(self) -> Path:
        """The run folder's own params.yaml (what its train stage resolved): serving it needs nothing re-passed."""
        return write_run_params(self.layout.run_dir, self.params)

    def train_steps(self, prune: bool = True) -> Iterator[Step]:
        """The phases still to run, lazily: early stopping is decided after each one finishes."""
        if prune:
            self.method.prune()
        for phase in self.method.pending():
            yield self.phase_step(phase.name)

    def phase_count(self) -> int:
        return len(self.method_cls.declared(self.params).phases())

    # -------------------------------------------------------------- evaluate
    def on_split(self, name: str) -> str:
        """A final-evaluation or baseline step's name: ``name`` for the test split, ``name-<split>`` for
        another, so each split keeps its own stamp (their results live in the stamps, not in files)."""
        split = self.params.evaluation.split
        return name if split == "test" else f"{name}-{split}"

    def _evaluation(self) -> dict[str, Any]:
        ev = self.params.evaluation
        return {"split": ev.split, "cutoffs": list(ev.cutoffs), "bootstrap": ev.bootstrap.model_dump(mode="json")}

    def baseline(self, name: str) -> Step:
        """A reference retriever on val and the final split (``BASELINES``: Lucene BM25 or dense
        MiniLM), k for F1@k chosen on val, per-query values kept on the final split.

        Key: the data fingerprint, the baseline's settings (its fixed parameters, the splits,
        the cut-offs, the bootstrap of its CIs, the per-query metrics kept) and the code it runs.
        """
        ev = self._evaluation()
        settings = {"baseline": name, **BASELINES[name], "val_split": MONITOR_SPLIT, "split": ev["split"],
                    "cutoffs": ev["cutoffs"], "bootstrap": ev["bootstrap"], "per_query": list(BASELINE_PER_QUERY)}
        key = step_key(f"baseline:{name}", settings, [self.data_fingerprint()], code_hash(BASELINE_CODE))
        return self._stamped(self.on_split(f"baseline-{name}"), f"{BASELINE_TITLES[name]} baseline", "evaluate", key, [],
                             lambda: baseline_result(self.method.dataset, name, ev["split"], ev["cutoffs"],
                                                     ev["bootstrap"]),
                             scope=f"data/{self.layout.dataset}")

    def baseline_steps(self) -> list[Step]:
        return [self.baseline(name) for name in BASELINES]

    @property
    def columns(self) -> list[str]:
        """The final table's metric columns: the method's headline, the baselines' F1@k*, NDCG@5/@10, R@10, then
        the method's other metrics (``coevo.report.table_columns``)."""
        from coevo.report import table_columns

        return table_columns(self.method_cls.table_metrics)

    def final(self) -> Step:
        """The method's start and chosen phase on the final split, read once; rows keep the
        per-query values of the table columns (the paired comparisons resample them)."""
        method = self.method
        trained = [p.name for p in method.phases() if method.is_done(p.name)]
        if not trained:
            raise FileNotFoundError(f"{self.layout.run_dir}: no finished {self.name} phase; run the train stage first")
        ev = self._evaluation()
        columns = self.columns
        key = step_key(f"{self.name}:final", {"split": ev["split"], "cutoffs": ev["cutoffs"], "per_query": columns},
                       [method.key(p) for p in trained], method.code_hash)
        split = self.params.evaluation.split

        def work() -> dict[str, Any]:
            return keep_per_query(method.final_evaluation(split), columns)

        return self._stamped(self.on_split(f"{self.name}-final"), f"final evaluation ({split})", "evaluate", key, [],
                             work)

    def evaluate_step_count(self) -> int:
        """How many steps the evaluate stage runs (for the progress bar; no step is built)."""
        return len(BASELINES) + 2 + exports_index(self.method_cls)

    def export(self, final: Step) -> Step | None:
        """The method's exports for other tools (CoGR: Lucene), or None when it has none."""
        if not exports_index(type(self.method)):
            return None
        out = self.layout.index_dir
        return self._stamped(f"{self.name}-export", "export index", "evaluate", step_key("export", {}, [final.key],
                             self.method.code_hash), [out], lambda: self.method.exports(out, final.run()))

    def reports(self, final: Step, baselines: list[Step]) -> Step:
        """metrics.json, plots and the final table with its paired comparisons (CIs, p-values).

        Key: the final evaluation's and the baselines' keys, the bootstrap settings and the
        code that builds the table and the reports. Returns {"files", "table"}.
        """
        lay = self.layout
        ev = self._evaluation()
        key = step_key(f"{self.name}:reports", {"bootstrap": ev["bootstrap"]}, [final.key, *(b.key for b in baselines)],
                       code_hash(REPORT_CODE + tuple(self.method.code)))

        def work() -> dict[str, Any]:
            from coevo import report
            from coevo.io import read_json, write_json

            lay.report_dir.mkdir(parents=True, exist_ok=True)
            results = {b.name.split("-")[1]: b.run() for b in baselines}  # baseline-<name>[-<split>]
            table = self.table(final.run(), results)
            public = {**final.run(), "rows": [{k: v for k, v in r.items() if k != "per_query"}
                                              for r in final.run()["rows"]]}
            by_split = {name: {s: report.baseline_row(r, s) for s in r["splits"]} for name, r in results.items()}
            files = self.method.write_reports(lay.metrics_file, lay.plots_csv, lay.report_dir, public, by_split)
            written = read_json(lay.metrics_file)
            written["evaluation"] = table  # n, split, cut-offs, baselines at k*, every comparison with its CI
            written["numerics"] = self.method.numerics_of(final.run()["best_phase"])  # what trained the chosen phase
            write_json(lay.metrics_file, written)
            return {"files": files, "table": table}

        # One name for every split: the reports of one split overwrite metrics.json and the plots, so
        # switching the split must re-key this step (the final evaluations keep a stamp per split).
        return self._stamped(f"{self.name}-reports", "reports", "evaluate", key,
                             [lay.metrics_file, lay.plots_csv, lay.report_dir], work)

    def table(self, final: dict[str, Any], baselines: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The final table (``coevo.report.evaluation_table``) of the finished run."""
        from coevo.report import evaluation_table, numbers

        n_val = len(self.method.dataset.relevant(MONITOR_SPLIT))
        val_rows = [{"label": r["label"], "phase": r["name"], "n_queries": int(r["eval"].get("n_queries", n_val)),
                     "metrics": numbers(r["eval"])} for r in self.method.rows()]
        ev = self._evaluation()
        return evaluation_table(method=self.name, dataset=self.layout.dataset, columns=self.columns,
                                val_rows=val_rows, final=final, baselines=baselines, bootstrap=ev["bootstrap"],
                                cutoffs=ev["cutoffs"], val_split=MONITOR_SPLIT,
                                paper_baseline=self.method_cls.paper_baseline)

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


def baseline_result(dataset: Dataset, name: str, split: str, cutoffs: list[int], bootstrap: dict[str, Any]) -> dict[str, Any]:
    """One baseline on val and ``split`` (one retrieval per split): k* chosen on val, every
    metric's mean with its bootstrap CI per split, the per-query values of
    ``BASELINE_PER_QUERY`` on ``split``."""
    from coevo.baselines import baseline_table, bm25_runs, dense_runs

    settings = BASELINES[name]
    splits = list(dict.fromkeys((MONITOR_SPLIT, split)))
    depth = max(cutoffs)
    if name == "bm25":
        runs = bm25_runs(dataset, splits, settings["k1"], settings["b"], depth)
    else:
        runs = dense_runs(dataset, splits, settings["encoder"], depth)
    tables = {s: baseline_table(dataset, name, split=s, val_split=MONITOR_SPLIT, cutoffs=cutoffs, k=depth, runs=runs,
                                resamples=bootstrap["resamples"], seed=bootstrap["seed"],
                                confidence=bootstrap["confidence"],
                                **({"k1": settings["k1"], "b": settings["b"]} if name == "bm25" else
                                   {"encoder": settings["encoder"]}))
              for s in splits}
    final = tables[split]
    values = final.evaluation.per_query
    per_query = {m: values[m] for m in BASELINE_PER_QUERY if m in values}
    per_query["f1"] = values[final.chosen_metric]
    return {
        "baseline": name, "label": final.label, "dataset": final.dataset, "params": final.params,
        "chosen_k": final.chosen_k, "chosen_on": MONITOR_SPLIT,
        "val_f1_at_k": {str(k): v for k, v in final.val_f1.items()},
        "splits": {s: {k: v for k, v in t.as_dict().items() if k not in ("params", "chosen_k", "cutoffs")}
                   for s, t in tables.items()},
        "per_query": per_query, "per_query_split": split,
    }


def keep_per_query(final: dict[str, Any], metrics: list[str]) -> dict[str, Any]:
    """The final evaluation with each row's per-query values cut to ``metrics``."""
    rows = []
    for row in final["rows"]:
        values = row.get("per_query") or {}
        rows.append({**row, "per_query": {m: values[m] for m in metrics if m in values}})
    return {**final, "rows": rows}
