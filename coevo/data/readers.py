"""Strict readers for raw source files: every error names the file and the line, row or field.

Row numbers in CSV/TSV messages follow the spreadsheet convention: the header is row 1, the
first record row 2 (equal to the line number unless a quoted field spans lines). Whole-file
text and JSON reads are :func:`coevo.io.read_text` and :func:`coevo.io.read_json`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

# read_text and read_json live in coevo.io (one copy for artifacts and raw sources); re-exported here.
from coevo.io import read_json, read_text  # noqa: F401


def require_dir(path: Path, what: str = "source folder") -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path}: {what} does not exist")
    if not path.is_dir():
        raise ValueError(f"{path}: expected a {what}, found a file")
    return path


def read_table(path: Path, columns: Sequence[str], *, sep: str = ",") -> pd.DataFrame:
    """A CSV/TSV whose header must be exactly ``columns`` (any order); every cell read as str."""
    text = read_text(path)
    try:
        frame = pd.read_csv(io.StringIO(text), sep=sep, dtype=str, keep_default_na=False, quoting=csv.QUOTE_MINIMAL)
    except pd.errors.ParserError as exc:
        kind = "TSV" if sep == "\t" else "CSV"
        raise ValueError(f"{path}: malformed {kind}: {' '.join(str(exc).split())}") from None
    header = [str(c) for c in frame.columns]
    missing = [c for c in columns if c not in header]
    extra = [c for c in header if c not in columns]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unexpected column(s) {', '.join(map(repr, extra))}")
        hint = " (is the file tab separated?)" if sep == "\t" and len(header) == 1 else ""
        raise ValueError(f"{path}: {'; '.join(parts)}; expected {', '.join(columns)}{hint}")
    if frame.empty:
        raise ValueError(f"{path}: no data rows below the header")
    return frame[list(columns)]


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a bad line is an error naming it."""
    records = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {lineno}: expected a JSON object, got {type(record).__name__}")
        records.append((lineno, record))
    if not records:
        raise ValueError(f"{path}: file is empty")
    return records


def require_fields(record: dict[str, Any], fields: Iterable[str], where: str) -> None:
    missing = [f for f in fields if f not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")


def first_duplicate(values: Sequence[str]) -> tuple[int, int] | None:
    """Positions (first, repeat) of the first value seen twice, or None."""
    seen: dict[str, int] = {}
    for pos, value in enumerate(values):
        if value in seen:
            return seen[value], pos
        seen[value] = pos
    return None


def check_unique(values: Sequence[str], where: str, field: str, *, row_offset: int = 2, unit: str = "row") -> None:
    """Raise naming the file, the field and both rows when an id repeats."""
    dup = first_duplicate(values)
    if dup is not None:
        first, again = dup
        raise ValueError(
            f"{where}: {unit} {again + row_offset}: duplicate {field} {values[again]!r} "
            f"(first at {unit} {first + row_offset})"
        )


def check_nonempty(values: Sequence[str], where: str, field: str, *, row_offset: int = 2, unit: str = "row") -> None:
    for pos, value in enumerate(values):
        if not str(value).strip():
            raise ValueError(f"{where}: {unit} {pos + row_offset}: empty {field}")
