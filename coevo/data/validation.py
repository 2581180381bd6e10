"""Great Expectations checks of the data contract; run before any training.

One expectation suite per table (items, queries, qrels). Cross-table rules are ordinary GE
expectations whose value set is the other table's ids (``qrels.item_id`` in
``items.item_id``, ...). "Every val/test query has a relevant item" is ``query_id`` in the
set of queries holding a qrel with grade > 0, restricted by a GE row condition to the
val/test rows. "At least one train query has a relevant item" is: among the queries with a
relevant item (a row condition), the distinct splits contain ``train``.

``validate()`` returns a :class:`ValidationReport` (``.ok``, ``.failures``) and, given a
path, writes it as JSON plus a short Markdown twin. ``ensure_valid()`` raises
:class:`DataValidationError` naming each failed expectation, its count and up to five
offending values, so nothing downstream runs on bad data.

GE is imported lazily and its ephemeral context (in memory, analytics and progress bars
off) is built once per process: building it costs seconds.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from coevo import io
from coevo.data.schema import ALL_SPLITS, TABLES, Dataset

MAX_VALUES = 5
ID_COLUMN = {"items": "item_id", "queries": "query_id", "qrels": None}
REPORT_NAME = "validation.json"


class DataValidationError(ValueError):
    """The data set breaks the contract; the message lists every failed expectation."""

    def __init__(self, message: str, report: "ValidationReport | None" = None):
        super().__init__(message)
        self.report = report


class Failure(NamedTuple):
    """One failed expectation: where, which, how many rows, up to five offending values."""

    table: str
    expectation: str
    column: str
    count: int
    values: list[Any]
    rule: str = ""  # the contract rule in words

    def describe(self) -> str:
        shown = ", ".join(repr(v) for v in self.values)
        if self.column == "(table)" or not self.count:
            return f"{self.table}: {self.expectation} failed ({self.rule}): {', '.join(map(str, self.values))}"
        rows = "row" if self.count == 1 else "rows"
        return f"{self.table}.{self.column}: {self.expectation} failed on {self.count} {rows} ({self.rule}); e.g. {shown}"


@dataclass
class ValidationReport:
    dataset: str
    failures: list[Failure] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    report_path: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        import great_expectations as gx

        return {
            "dataset": self.dataset,
            "ok": self.ok,
            "great_expectations_version": gx.__version__,
            "n_checks": len(self.checks),
            "n_failures": len(self.failures),
            "failures": [f._asdict() for f in self.failures],
            "checks": self.checks,
        }

    def to_markdown(self) -> str:
        status = "PASSED" if self.ok else f"FAILED ({len(self.failures)} of {len(self.checks)} expectations)"
        lines = [f"# Data validation: {self.dataset}", "", f"**{status}** (Great Expectations)", ""]
        if self.failures:
            lines += ["| table | column | expectation | rows | rule | offending values (up to 5) |", "|---|---|---|---|---|---|"]
            for f in self.failures:
                values = ", ".join(f"`{v!r}`" for v in f.values).replace("|", "\\|")
                lines.append(f"| {f.table} | {f.column} | {f.expectation} | {f.count} | {f.rule} | {values} |")
            lines.append("")
        lines.append("## Checks")
        lines += [f"- [{'x' if c['success'] else ' '}] {c['table']}.{c['column']}: {c['expectation']} ({c['rule']})" for c in self.checks]
        return "\n".join(lines) + "\n"

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        io.write_json(path, io.jsonable(self.to_dict()))
        io.write_text(path.with_suffix(".md"), self.to_markdown())
        self.report_path = path
        return path

    def message(self) -> str:
        head = f"{self.dataset}: data validation failed ({len(self.failures)} expectation(s))"
        body = [f"  - {f.describe()}" for f in self.failures]
        tail = [f"  report: {self.report_path} (and {self.report_path.with_suffix('.md')})"] if self.report_path else []
        return "\n".join([head, *body, *tail])


# ------------------------------------------------------------------------------ GE plumbing
@functools.lru_cache(maxsize=1)
def _batch_definitions() -> dict[str, Any]:
    """One ephemeral GE context per process, with a whole-dataframe batch definition per table."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
    )
    context = gx.get_context(mode="ephemeral", project_config=config)
    source = context.data_sources.add_pandas("coevo")
    return {table: source.add_dataframe_asset(name=table).add_batch_definition_whole_dataframe("whole") for table in TABLES}


def _rule(expectation: Any, rule: str) -> Any:
    # GE keeps free-form notes on an expectation; we carry the contract rule there.
    expectation.notes = rule
    return expectation


def build_suites(dataset: Dataset) -> dict[str, Any]:
    """The three expectation suites for ``dataset`` (cross-table value sets filled from it)."""
    import great_expectations as gx
    from great_expectations.expectations.row_conditions import Column

    E = gx.expectations
    items, queries, qrels = dataset.items, dataset.queries, dataset.qrels
    item_ids = sorted(set(items["item_id"].dropna()) & set(qrels["item_id"].dropna()))
    query_ids = sorted(set(queries["query_id"].dropna()) & set(qrels["query_id"].dropna()))
    eval_queries = set(queries.loc[queries["split"].isin(["val", "test", "vague"]), "query_id"].dropna())
    relevant = set(qrels.loc[qrels["grade"] > 0, "query_id"].dropna())
    answered = sorted(eval_queries & relevant)
    # Queries that have a relevant item (any split); "" keeps the condition valid when there is none.
    with_relevant = sorted(relevant & set(queries["query_id"].dropna())) or [""]

    def suite(name: str, expectations: list[Any]) -> Any:
        s = gx.ExpectationSuite(name=f"coevo.{name}")
        for e in expectations:
            s.add_expectation(e)
        return s

    return {
        "items": suite("items", [
            _rule(E.ExpectTableRowCountToBeBetween(min_value=1), "the corpus has at least one item"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="item_id"), "every item has an id"),
            _rule(E.ExpectColumnValuesToBeUnique(column="item_id"), "item ids are unique"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="title"), "every item has a title"),
            _rule(E.ExpectColumnValuesToMatchRegex(column="title", regex=r"\S"), "titles are not empty"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="text"), "text is a string (it may be empty)"),
        ]),
        "queries": suite("queries", [
            _rule(E.ExpectTableRowCountToBeBetween(min_value=1), "there is at least one query"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="query_id"), "every query has an id"),
            _rule(E.ExpectColumnValuesToBeUnique(column="query_id"), "query ids are unique"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="text"), "every query has text"),
            _rule(E.ExpectColumnValuesToMatchRegex(column="text", regex=r"\S"), "query text is not empty"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="split"), "every query has a split"),
            _rule(E.ExpectColumnValuesToBeInSet(column="split", value_set=list(ALL_SPLITS)), "split is train, val, test (or vague)"),
            _rule(
                E.ExpectColumnValuesToBeInSet(
                    column="query_id", value_set=answered, row_condition=Column("split").is_in(["val", "test", "vague"])
                ),
                "every val/test query (and vague copy) has at least one relevant item (grade > 0)",
            ),
            _rule(
                E.ExpectColumnDistinctValuesToContainSet(
                    column="split", value_set=["train"], row_condition=Column("query_id").is_in(with_relevant)
                ),
                "at least one train query has a relevant item (grade > 0): training needs a signal",
            ),
        ]),
        "qrels": suite("qrels", [
            _rule(E.ExpectTableRowCountToBeBetween(min_value=1), "there is at least one judgement"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="query_id"), "every qrel names a query"),
            _rule(E.ExpectColumnValuesToNotBeNull(column="item_id"), "every qrel names an item"),
            _rule(E.ExpectColumnValuesToBeInSet(column="query_id", value_set=query_ids), "every qrel names a known query"),
            _rule(E.ExpectColumnValuesToBeInSet(column="item_id", value_set=item_ids), "every qrel names a known item"),
            _rule(
                E.ExpectColumnValuesToBeInSet(column="grade", value_set=list(dataset.grades)),
                f"grade is one of the source's levels {list(dataset.grades)}",
            ),
            _rule(
                E.ExpectCompoundColumnsToBeUnique(column_list=["query_id", "item_id"]),
                "no (query, item) pair is judged twice",
            ),
        ]),
    }


def _offending(result: dict[str, Any], table: str, column: str) -> list[Any]:
    """Up to five offending values; for text/null checks the row ids say more than the value."""
    id_column = ID_COLUMN[table]
    index_list = result.get("partial_unexpected_index_list") or []
    if id_column and column != id_column and index_list and isinstance(index_list[0], dict):
        values = [f"{column}={io.jsonable(row.get(column))!r} at {id_column}={row.get(id_column)!r}" for row in index_list]
    elif table == "qrels" and column == "query_id,item_id":
        values = [tuple(v.values()) if isinstance(v, dict) else v for v in result.get("partial_unexpected_list", [])]
    else:
        values = list(result.get("partial_unexpected_list") or [])
    unique: list[Any] = []
    for value in values:
        if value not in unique:
            unique.append(value)
    return [io.jsonable(v) for v in unique[:MAX_VALUES]]


def _exception_message(info: Any) -> str | None:
    if not info:
        return None
    if isinstance(info, dict) and info.get("raised_exception"):
        return str(info.get("exception_message"))
    if isinstance(info, dict):
        for value in info.values():
            if isinstance(value, dict) and value.get("raised_exception"):
                return str(value.get("exception_message"))
    return None


def validate(dataset_or_dir: Dataset | str | Path, report_path: str | Path | None = None) -> ValidationReport:
    """Run the three suites; write the report when ``report_path`` is given.

    Given a folder and no report path, the report goes to ``<folder>/validation.json``.
    """
    if isinstance(dataset_or_dir, Dataset):
        dataset = dataset_or_dir
    else:
        dataset = Dataset.load(dataset_or_dir)
        if report_path is None:
            report_path = Path(dataset_or_dir) / REPORT_NAME
    definitions = _batch_definitions()
    report = ValidationReport(dataset=dataset.name)
    for table, suite in build_suites(dataset).items():
        frame: pd.DataFrame = getattr(dataset, table)
        batch = definitions[table].get_batch(batch_parameters={"dataframe": frame})
        id_column = ID_COLUMN[table]
        result_format: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 20}
        if id_column:
            result_format["unexpected_index_column_names"] = [id_column]
        outcome = batch.validate(suite, result_format=result_format)
        for result in outcome.results:
            config = result.expectation_config
            kwargs = config.kwargs
            column = kwargs.get("column") or ",".join(kwargs.get("column_list") or []) or "(table)"
            details = result.result or {}
            error = _exception_message(result.exception_info)
            count = int(details.get("unexpected_count") or 0)
            check = {
                "table": table,
                "column": column,
                "expectation": config.type,
                "rule": config.notes or "",
                "success": bool(result.success),
                "unexpected_count": count,
            }
            report.checks.append(check)
            if not result.success:
                if error:
                    values = [error]
                elif column == "(table)":
                    values = [f"{details.get('observed_value')} rows"]
                elif details.get("partial_missing_list"):
                    values = [f"no {v!r} value where the rule applies" for v in details["partial_missing_list"]]
                else:
                    values = _offending(details, table, column)
                report.failures.append(Failure(table, config.type, column, count, values, config.notes or ""))
    if report_path is not None:
        report.write(report_path)
    return report


def ensure_valid(dataset_or_dir: Dataset | str | Path, report_path: str | Path | None = None) -> ValidationReport:
    """:func:`validate`, raising :class:`DataValidationError` on any failed expectation."""
    report = validate(dataset_or_dir, report_path)
    if not report.ok:
        raise DataValidationError(report.message(), report)
    return report
