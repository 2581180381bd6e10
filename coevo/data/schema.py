"""The one shape every data set takes: three tables (items, queries, qrels) and a little metadata.

DESIGN.md's data contract:

- ``items``: item_id (str, unique), title (str, non-empty), text (str, may be empty), plus
  optional columns (category, image_path, tool_name, ...).
- ``queries``: query_id (str, unique), text (non-empty), split (train/val/test), optional group.
- ``qrels``: query_id, item_id, grade (int; > 0 relevant).

This module checks structure only (files and columns exist, types can be coerced); content
rules (uniqueness, non-empty text, dangling qrels, ...) live in :mod:`coevo.data.validation`,
which reports every problem at once instead of stopping at the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from coevo import io

SPLITS: tuple[str, ...] = ("train", "val", "test")
# Splits a prepared data set may add to the source's: "vague" = test queries with their items'
# vocabulary taken out (coevo.data.vague, ``data.vague: test_copy``); evaluated, never trained on.
DERIVED_SPLITS: tuple[str, ...] = ("vague",)
ALL_SPLITS: tuple[str, ...] = SPLITS + DERIVED_SPLITS
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "items": ("item_id", "title", "text"),
    "queries": ("query_id", "text", "split"),
    "qrels": ("query_id", "item_id", "grade"),
}
TABLES: tuple[str, ...] = tuple(REQUIRED_COLUMNS)
META_FILE = "dataset.json"
FORMAT_VERSION = 1


def _check_columns(frame: pd.DataFrame, table: str, where: str) -> None:
    missing = [c for c in REQUIRED_COLUMNS[table] if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{where}: missing column(s) {', '.join(map(repr, missing))} "
            f"(the {table} table needs {', '.join(REQUIRED_COLUMNS[table])}; found {', '.join(map(str, frame.columns)) or 'none'})"
        )


def _as_str(series: pd.Series) -> pd.Series:
    """Strings stay strings, nulls stay null (validation reports them), numbers become text."""
    return series.map(lambda v: v if v is None or isinstance(v, str) or pd.isna(v) else str(v)).astype(object)


@dataclass
class Dataset:
    """Items, queries and graded relevance judgements of one data set.

    ``grades`` is the set of grade values the source defines (MetaTool: relevant only = (1,);
    WANDS: Irrelevant 0, Partial 1, Exact 2); validation checks every qrel against it.
    """

    items: pd.DataFrame
    queries: pd.DataFrame
    qrels: pd.DataFrame
    name: str = "dataset"
    source: str = ""
    seed: int | None = None
    grades: tuple[int, ...] = (1,)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for table in TABLES:
            frame = getattr(self, table)
            if not isinstance(frame, pd.DataFrame):
                raise TypeError(f"Dataset.{table} must be a pandas DataFrame, got {type(frame).__name__}")
            _check_columns(frame, table, f"{self.name}: {table} table")
        self.items = self._normalise(self.items, ("item_id", "title", "text"))
        self.queries = self._normalise(self.queries, ("query_id", "text", "split"))
        self.qrels = self._normalise(self.qrels, ("query_id", "item_id"))
        self.grades = tuple(sorted({int(g) for g in self.grades}))
        self._item_rows: dict[str, int] | None = None

    @staticmethod
    def _normalise(frame: pd.DataFrame, str_columns: tuple[str, ...]) -> pd.DataFrame:
        frame = frame.reset_index(drop=True).copy()
        for column in str_columns:
            frame[column] = _as_str(frame[column])
        if "grade" in frame.columns:
            try:
                frame["grade"] = pd.to_numeric(frame["grade"], errors="raise").astype("int64")
            except (ValueError, TypeError) as exc:
                raise ValueError(f"qrels table: column 'grade' must hold integers ({exc})") from None
        return frame

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | Path) -> Path:
        """Write items/queries/qrels.parquet and dataset.json into ``directory``.

        Each file is written to a temporary name and renamed (coevo.io), so an interrupted
        save never leaves a half-written parquet; dataset.json goes last and marks completion.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # A stale marker or validation report must not vouch for the new tables.
        for stale in (META_FILE, "validation.json", "validation.md"):
            (directory / stale).unlink(missing_ok=True)
        for table in TABLES:
            io.write_parquet(directory / f"{table}.parquet", getattr(self, table))
        io.write_json(directory / META_FILE, self.metadata())
        return directory

    def metadata(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "source": self.source,
            "seed": self.seed,
            "grades": list(self.grades),
            "counts": {"items": len(self.items), "queries": len(self.queries), "qrels": len(self.qrels)},
            "meta": self.meta,
        }

    @classmethod
    def load(cls, directory: str | Path) -> "Dataset":
        """Read a folder written by :meth:`save`; errors name the missing file or column."""
        directory = Path(directory)
        if not directory.exists():
            raise FileNotFoundError(f"{directory}: dataset folder does not exist (run `coevo data prepare` first)")
        if not directory.is_dir():
            raise ValueError(f"{directory}: expected a dataset folder, found a file")
        frames: dict[str, pd.DataFrame] = {}
        for table in TABLES:
            path = directory / f"{table}.parquet"
            if not path.exists():
                raise FileNotFoundError(f"{path}: file does not exist (a prepared dataset has {', '.join(t + '.parquet' for t in TABLES)})")
            try:
                frame = pd.read_parquet(path)
            except Exception as exc:  # pyarrow raises several types for a corrupt file
                raise ValueError(f"{path}: cannot read parquet ({exc})") from None
            _check_columns(frame, table, str(path))
            frames[table] = frame
        meta_path = directory / META_FILE
        if not meta_path.exists():
            raise FileNotFoundError(f"{meta_path}: file does not exist (the save was interrupted or the folder is not a dataset)")
        meta = io.read_json(meta_path)
        if not isinstance(meta, dict):
            raise ValueError(f"{meta_path}: expected a JSON object")
        try:
            return cls(
                **frames,
                name=str(meta.get("name", directory.name)),
                source=str(meta.get("source", "")),
                seed=meta.get("seed"),
                grades=tuple(meta.get("grades", (1,))),
                meta=dict(meta.get("meta", {})),
            )
        except ValueError as exc:
            raise ValueError(f"{directory}: {exc}") from None

    # ------------------------------------------------------------------ accessors
    def queries_in(self, split: str) -> pd.DataFrame:
        """The queries of one split (fresh 0..n-1 index, original order)."""
        if split not in ALL_SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(ALL_SPLITS)}")
        return self.queries[self.queries["split"] == split].reset_index(drop=True)

    def relevant(self, split: str | None = None, min_grade: int = 1) -> dict[str, dict[str, int]]:
        """query_id -> {item_id: grade} for grades >= ``min_grade``, optionally one split only.

        Queries without any such item are absent from the result.
        """
        qrels = self.qrels[self.qrels["grade"] >= min_grade]
        if split is not None:
            qrels = qrels[qrels["query_id"].isin(set(self.queries_in(split)["query_id"]))]
        out: dict[str, dict[str, int]] = {}
        for qid, iid, grade in zip(qrels["query_id"], qrels["item_id"], qrels["grade"]):
            out.setdefault(qid, {})[iid] = int(grade)
        return out

    def item_text(self, item_id: str) -> str:
        """``"title: text"`` for an item (just the title when its text is empty)."""
        if self._item_rows is None:
            self._item_rows = {iid: pos for pos, iid in enumerate(self.items["item_id"])}
        try:
            row = self.items.iloc[self._item_rows[item_id]]
        except KeyError:
            raise KeyError(f"{self.name}: unknown item_id {item_id!r}") from None
        title, text = str(row["title"]).strip(), ("" if pd.isna(row["text"]) else str(row["text"]).strip())
        return f"{title}: {text}" if text else title

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, items={len(self.items)}, queries={len(self.queries)}, "
            f"qrels={len(self.qrels)}, grades={self.grades})"
        )

