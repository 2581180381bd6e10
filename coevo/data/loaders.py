"""Loaders that turn each public source into the three tables of DESIGN.md's data contract.

``load_source(loader, source, seed=..., ...)`` picks a registered loader by name. A loader
reads the raw files strictly (coevo.data.readers: every error names the file and the row,
line or field) and returns items, queries and qrels; where the source has no split,
:func:`coevo.data.splits.assign_splits` draws a seeded one, stratified by ``group``.

Per-source choices (also in the README of each loader function below):

- metatool: one item per tool in plugin_des.json; a query text listed with several tools
  in all_clean_data.csv is ONE query with several relevant tools. When
  multi_tool_query_golden.json is present, its 497 two-tool queries are added too (group
  ``multi_tool_query_golden``; the others are group ``all_clean_data``), so the split keeps
  both kinds in every split. ``include_multi_tool=False`` leaves them out.
- stabletoolbench: one item per (tool, API) over the union of every query's api_list.
- wands: Exact=2, Partial=1, Irrelevant=0; local folder, or ``download=True`` fetches the
  official files into the source folder (size-checked cache).
- beir: the qrels file name gives the split (train -> train, dev/val/validation -> val, test).
  A document without a title gets its ``_id`` as title (the contract needs a non-empty
  title; the start of the text would make BM25 count those words twice).
- image_captions: items are images, queries are captions; the split comes from the file.
- prepared: a folder ``coevo data prepare`` wrote (a team's own data, converted once by any
  means): its tables and its train/val/test splits as they are.

Common to every loader (``load_source`` options, the ``data`` params):

- ``min_grade`` (data.min_grade): judgements graded below it become grade 0 (judged, not
  relevant); the others keep their grade. WANDS: 2 = Exact only.
- splits (data.split_scheme): ``fractions`` draws a seeded split where the source has none;
  a source that fixes its splits but has no val (or no test) queries gets a seeded val
  (test) carved from its train queries at ``val_fraction`` (``test_fraction``), since
  every method monitors training on val. ``wands_430_50`` is the CoGR paper's WANDS split:
  50 seeded test queries (with a relevant product), the other 430 train, ``val_fraction``
  of them held out as val.
- duplicates (data.duplicates): a row that repeats an earlier one (a judgement of the same
  pair, a query-tool pair, a document, a query, a caption given twice) is dropped and
  reported (count and the first examples, each naming its file and row: a warning and
  ``meta.duplicates`` in dataset.json), or, with ``error``, the source is refused with the
  same report. Repeated judgements keep the highest grade. The same id with *different*
  content is never a duplicate: it is an error naming both rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coevo.data.readers import (
    check_nonempty,
    check_unique,
    read_json,
    read_jsonl,
    read_table,
    require_dir,
    require_fields,
)
from coevo.data.schema import SPLITS, Dataset
from coevo.data.splits import assign_splits

WANDS_BASE_URL = "https://raw.githubusercontent.com/wayfair/WANDS/main/dataset"
WANDS_FILES = ("product.csv", "query.csv", "label.csv")
WANDS_GRADES = {"Exact": 2, "Partial": 1, "Irrelevant": 0}
WANDS_PRODUCT_COLUMNS = (
    "product_id", "product_name", "product_class", "category_hierarchy", "product_description",
    "product_features", "rating_count", "average_rating", "review_count",
)
BEIR_SPLITS = {"train": "train", "dev": "val", "val": "val", "validation": "val", "test": "test"}
SPLIT_SCHEMES = ("fractions", "wands_430_50")
DUPLICATE_POLICIES = ("drop", "error")
# The CoGR paper's WANDS split: 480 queries, 430 for training, 50 for test.
WANDS_PAPER_TEST_QUERIES = 50
DUPLICATE_EXAMPLES = 5

log = logging.getLogger(__name__)


class Duplicates:
    """Duplicate source rows a loader dropped: per kind, the count and the first examples."""

    def __init__(self) -> None:
        self._found: dict[str, dict[str, Any]] = {}

    def add(self, kind: str, where: str, count: int = 1) -> None:
        entry = self._found.setdefault(kind, {"count": 0, "examples": []})
        entry["count"] += count
        if len(entry["examples"]) < DUPLICATE_EXAMPLES:
            entry["examples"].append(where)

    def report(self) -> dict[str, dict[str, Any]]:
        return {kind: {"count": e["count"], "examples": list(e["examples"])} for kind, e in self._found.items()}


def _drop_repeated_rows(frame: pd.DataFrame, key: Sequence[str], path: Path, kind: str, dups: Duplicates,
                        *, row_offset: int = 2, unit: str = "row") -> pd.DataFrame:
    """``frame`` without rows that repeat an earlier row exactly (reported in ``dups``); a key
    repeated with different other fields is an error naming both rows."""
    repeated = frame.duplicated(subset=list(key), keep="first").to_numpy()
    if not repeated.any():
        return frame
    exact = frame.duplicated(keep="first").to_numpy()
    first_of = {k: pos for pos, k in enumerate(_keys(frame, key)) if not repeated[pos]}
    keys = _keys(frame, key)
    label = " ".join(key)
    for pos in repeated.nonzero()[0]:
        first = first_of[keys[pos]]
        shown = keys[pos] if len(key) > 1 else keys[pos][0]
        where = f"{path.name}: {unit} {pos + row_offset}: duplicate {label} {shown!r} (first at {unit} {first + row_offset})"
        if not exact[pos]:
            raise ValueError(f"{path.parent / where} with different fields (the same id must mean the same record)")
        dups.add(kind, where)
    return frame[~repeated].reset_index(drop=True)


def _keys(frame: pd.DataFrame, key: Sequence[str]) -> list[tuple[str, ...]]:
    return list(zip(*(frame[c].astype(str) for c in key)))


@dataclass
class Loaded:
    """What a loader returns; ``queries`` has a ``split`` column only when the source fixes one."""

    items: pd.DataFrame
    queries: pd.DataFrame
    qrels: pd.DataFrame
    grades: tuple[int, ...] = (1,)
    meta: dict[str, Any] = field(default_factory=dict)
    duplicates: Duplicates = field(default_factory=Duplicates)  # what the loader dropped


LOADERS: dict[str, Callable[..., Loaded]] = {}


def register_loader(name: str) -> Callable[[Callable[..., Loaded]], Callable[..., Loaded]]:
    def wrap(fn: Callable[..., Loaded]) -> Callable[..., Loaded]:
        LOADERS[name] = fn
        return fn

    return wrap


def load_source(
    loader: str,
    source: str | Path,
    *,
    seed: int = 42,
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    name: str | None = None,
    min_grade: int = 1,
    split_scheme: str = "fractions",
    duplicates: str = "drop",
    **options: Any,
) -> Dataset:
    """Read ``source`` with the loader registered as ``loader`` into a :class:`Dataset`.

    ``min_grade``, ``split_scheme`` and ``duplicates`` are the ``data`` knobs of the same
    names (module docstring). ``options`` go to the loader (metatool: include_multi_tool;
    wands: download, base_url; image_captions: lang).
    """
    if loader not in LOADERS:
        raise ValueError(f"unknown loader {loader!r}; expected one of {', '.join(sorted(LOADERS))}")
    if split_scheme not in SPLIT_SCHEMES:
        raise ValueError(f"unknown split scheme {split_scheme!r}; expected one of {', '.join(SPLIT_SCHEMES)}")
    if split_scheme == "wands_430_50" and loader != "wands":
        raise ValueError(f"split scheme wands_430_50 is the WANDS paper split; the loader is {loader!r}")
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(f"duplicates must be one of {', '.join(DUPLICATE_POLICIES)}, got {duplicates!r}")
    if isinstance(min_grade, bool) or not isinstance(min_grade, int) or min_grade < 1:
        raise ValueError(f"min_grade must be an integer >= 1, got {min_grade!r}")
    source = Path(source)
    try:
        loaded = LOADERS[loader](source, **options)
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc):
            raise ValueError(f"loader {loader!r}: unknown option ({exc})") from None
        raise
    found = loaded.duplicates.report()
    if found:
        summary = "; ".join(f"{e['count']} {kind} (first: {', '.join(e['examples'])})" for kind, e in found.items())
        if duplicates == "error":
            raise ValueError(f"{source}: duplicate rows (data.duplicates = error): {summary}")
        log.warning("%s: dropped duplicate rows: %s", source, summary)
    qrels = loaded.qrels
    if min_grade > 1:
        qrels = qrels.assign(grade=qrels["grade"].where(qrels["grade"] >= min_grade, 0))
    if not (qrels["grade"] > 0).any():
        raise ValueError(f"{source}: no judgement has a grade >= {min_grade} (data.min_grade); nothing is relevant")
    queries = loaded.queries.copy()
    if split_scheme == "wands_430_50":
        queries["split"] = _paper_split(queries, qrels, seed, val_fraction, source)
        split_rule = (f"wands_430_50 (seed {seed}): {WANDS_PAPER_TEST_QUERIES} test queries, the rest train with "
                      f"val_fraction {val_fraction} held out as val")
    elif "split" in queries.columns:
        split_rule = "from source"
        carved = []
        for split, fraction in (("val", val_fraction), ("test", test_fraction)):
            if not (queries["split"] == split).any() and fraction > 0:
                queries["split"] = _carve(queries, qrels, split, fraction, seed)
                carved.append(f"{split} carved from train (seed {seed}, {split}_fraction {fraction})")
        if carved:
            split_rule += "; " + "; ".join(carved)
    else:
        split_rule = f"seeded (seed {seed}, val {val_fraction}, test {test_fraction}, stratified by group)"
        queries["split"] = assign_splits(
            queries, qrels, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction
        )
    meta = {"loader": loader, "options": {k: v for k, v in options.items()}, "split": split_rule,
            "min_grade": min_grade, "duplicates": found, **loaded.meta}
    return Dataset(
        items=loaded.items,
        queries=queries,
        qrels=qrels,
        name=name or loader,
        source=str(source),
        seed=seed,
        grades=loaded.grades,
        meta=meta,
    )


def _carve(queries: pd.DataFrame, qrels: pd.DataFrame, split: str, fraction: float, seed: int) -> pd.Series:
    """The split column with a seeded ``fraction`` of the train queries moved to ``split``
    (stratified by group, only queries with a relevant item; coevo.data.splits)."""
    out = queries["split"].copy()
    train = queries[queries["split"] == "train"]
    if train.empty:
        return out
    drawn = assign_splits(train, qrels, seed=seed, val_fraction=fraction, test_fraction=0.0)
    out.loc[drawn.index[drawn == "val"]] = split
    return out


def _paper_split(queries: pd.DataFrame, qrels: pd.DataFrame, seed: int, val_fraction: float, source: Path) -> pd.Series:
    """The WANDS paper split: 50 seeded test queries with a relevant product, the others train,
    ``val_fraction`` of those (with a relevant product) held out as val."""
    eligible = sorted(set(qrels.loc[qrels["grade"] > 0, "query_id"]) & set(queries["query_id"]))
    if len(eligible) <= WANDS_PAPER_TEST_QUERIES:
        raise ValueError(f"{source}: split scheme wands_430_50 needs more than {WANDS_PAPER_TEST_QUERIES} queries "
                         f"with a relevant product; the source has {len(eligible)}")
    rng = np.random.default_rng([seed, WANDS_PAPER_TEST_QUERIES])
    test = {eligible[i] for i in rng.permutation(len(eligible))[:WANDS_PAPER_TEST_QUERIES]}
    split = pd.Series(["test" if q in test else "train" for q in queries["query_id"]], index=queries.index, dtype=object)
    return _carve(queries.assign(split=split), qrels, "val", val_fraction, seed) if val_fraction > 0 else split


def _text_id(prefix: str, text: str) -> str:
    """A stable id from the text itself, so a subset (the embedded sample) keeps the full set's ids."""
    return f"{prefix}{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"


def _qrels(rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["query_id", "item_id", "grade"])
    frame["grade"] = frame["grade"].astype("int64")
    return frame


# ---------------------------------------------------------------------------------- MetaTool
@register_loader("metatool")
def load_metatool(source: Path, *, include_multi_tool: bool = True) -> Loaded:
    """MetaTool (ToolE): all_clean_data.csv (Query, Tool) + plugin_des.json (tool -> description).

    Items are the tools of plugin_des.json (item_id = title = tool name, text = description).
    Queries are distinct query texts (id = "q" + sha1 of the text), each relevant to every tool
    it is listed with. multi_tool_query_golden.json, when present, adds its multi-tool queries.
    """
    require_dir(source)
    csv_path, des_path = source / "all_clean_data.csv", source / "plugin_des.json"
    pairs = read_table(csv_path, ["Query", "Tool"])
    check_nonempty(list(pairs["Query"]), str(csv_path), "Query")
    check_nonempty(list(pairs["Tool"]), str(csv_path), "Tool")
    dups = Duplicates()
    pairs = pairs.assign(Query=pairs["Query"].str.strip(), Tool=pairs["Tool"].str.strip(), row=range(2, len(pairs) + 2))
    repeated = pairs.duplicated(subset=["Query", "Tool"], keep="first")
    for row, query, tool in pairs.loc[repeated, ["row", "Query", "Tool"]].itertuples(index=False):
        dups.add("query-tool pairs", f"{csv_path.name}: row {row}: ({query[:40]!r}, {tool!r}) again")
    n_pairs = len(pairs)
    pairs = pairs[~repeated]
    descriptions = read_json(des_path)
    if not isinstance(descriptions, dict) or not descriptions:
        raise ValueError(f"{des_path}: expected a non-empty JSON object mapping tool name -> description")
    for tool, text in descriptions.items():
        if not isinstance(text, str):
            raise ValueError(f"{des_path}: field {tool!r}: description must be a string, got {type(text).__name__}")
        if not tool.strip():
            raise ValueError(f"{des_path}: empty tool name")

    tools_of: dict[str, list[str]] = {}  # query text -> tools, first-seen order
    group_of: dict[str, str] = {}
    for row, query, tool in zip(pairs["row"], pairs["Query"], pairs["Tool"]):
        if tool not in descriptions:
            raise ValueError(f"{csv_path}: row {row}: tool {tool!r} has no description in {des_path.name}")
        tools = tools_of.setdefault(query, [])
        group_of.setdefault(query, "all_clean_data")
        if tool not in tools:
            tools.append(tool)

    multi_path = source / "multi_tool_query_golden.json"
    n_multi = 0
    if include_multi_tool and multi_path.exists():
        records = read_json(multi_path)
        if not isinstance(records, list):
            raise ValueError(f"{multi_path}: expected a JSON list of {{query, tool: [...]}} records")
        for n, record in enumerate(records):
            where = f"{multi_path}: record {n}"
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected an object")
            require_fields(record, ("query", "tool"), where)
            query, tools = record["query"], record["tool"]
            if not isinstance(query, str) or not query.strip():
                raise ValueError(f"{where}: empty 'query'")
            if not isinstance(tools, list) or not tools or not all(isinstance(t, str) for t in tools):
                raise ValueError(f"{where}: 'tool' must be a non-empty list of tool names")
            query = query.strip()
            known = tools_of.setdefault(query, [])
            group_of.setdefault(query, "multi_tool_query_golden")
            for tool in tools:
                if tool not in descriptions:
                    raise ValueError(f"{where}: tool {tool!r} has no description in {des_path.name}")
                if tool not in known:
                    known.append(tool)
            n_multi += 1

    ids = {text: _text_id("q", text) for text in tools_of}
    if len(set(ids.values())) != len(ids):
        raise ValueError(f"{source}: two query texts hash to the same id; cannot build stable query ids")
    items = pd.DataFrame(
        {"item_id": list(descriptions), "title": list(descriptions), "text": [t.strip() for t in descriptions.values()]}
    )
    queries = pd.DataFrame(
        {"query_id": [ids[t] for t in tools_of], "text": list(tools_of), "group": [group_of[t] for t in tools_of]}
    )
    qrels = _qrels([(ids[text], tool, 1) for text, tools in tools_of.items() for tool in tools])
    meta = {"pairs_in_csv": n_pairs, "multi_tool_queries": n_multi}
    return Loaded(items, queries, qrels, grades=(1,), meta=meta, duplicates=dups)


# ---------------------------------------------------------------------------------- StableToolBench
def _stabletoolbench_dir(source: Path) -> Path:
    require_dir(source)
    nested = source / "solvable_queries" / "test_instruction"
    if nested.is_dir():
        return nested
    if any(source.glob("*.json")):
        return source
    raise FileNotFoundError(
        f"{source}: no StableToolBench query files (expected solvable_queries/test_instruction/*.json or *.json here)"
    )


def _api_record(api: Any, where: str) -> dict[str, Any]:
    if not isinstance(api, dict):
        raise ValueError(f"{where}: expected an object")
    require_fields(api, ("tool_name", "api_name"), where)
    for key in ("tool_name", "api_name"):
        if not isinstance(api[key], str) or not api[key].strip():
            raise ValueError(f"{where}: empty {key!r}")
    tool, name = api["tool_name"].strip(), api["api_name"].strip()
    description = str(api.get("api_description") or "").strip()
    return {
        "item_id": f"{tool}::{name}",
        # Tools with empty descriptions keep their names, so every item has a title.
        "title": f"{tool}: {name}",
        "text": description,
        "category": str(api.get("category_name") or "").strip(),
        "tool_name": tool,
        "api_name": name,
        "api_description": description,
        "tool_description": str(api.get("tool_description") or "").strip(),
        "parameters": json.dumps(
            {"required": api.get("required_parameters") or [], "optional": api.get("optional_parameters") or []},
            ensure_ascii=False,
        ),
        "method": str(api.get("method") or ""),
        "template_response": json.dumps(api["template_response"], ensure_ascii=False) if "template_response" in api else "",
    }


@register_loader("stabletoolbench")
def load_stabletoolbench(source: Path) -> Loaded:
    """StableToolBench solvable queries: one JSON file per group (G1_instruction, ...).

    Items: one per (tool_name, api_name) over every query's api_list (item_id
    "tool::api"); when the same API appears with different records, the first one in
    file-name order wins unless it has no description and a later one has. Queries keep
    their group (file stem) and source id; query_id = "<group>:<query_id>". Relevant items
    are the record's "relevant APIs" ([tool, api] pairs), grade 1.
    """
    folder = _stabletoolbench_dir(source)
    dups = Duplicates()
    items: dict[str, dict[str, Any]] = {}
    conflicts = 0
    queries: list[dict[str, Any]] = []
    wanted: list[tuple[str, str, str]] = []  # (query_id, item_id, where)
    for path in sorted(folder.glob("*.json")):
        records = read_json(path)
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected a JSON list of query records")
        group = path.stem
        for n, record in enumerate(records):
            where = f"{path}: record {n}"
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected an object")
            require_fields(record, ("query", "query_id", "api_list", "relevant APIs"), where)
            text = record["query"]
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{where}: empty 'query'")
            query_id = f"{group}:{record['query_id']}"
            if not isinstance(record["api_list"], list) or not record["api_list"]:
                raise ValueError(f"{where}: 'api_list' must be a non-empty list")
            for k, api in enumerate(record["api_list"]):
                row = _api_record(api, f"{where}: api_list[{k}]")
                kept = items.get(row["item_id"])
                if kept is None:
                    items[row["item_id"]] = row
                elif kept != row:
                    conflicts += 1
                    if not kept["text"] and row["text"]:
                        items[row["item_id"]] = row
            relevant = record["relevant APIs"]
            if not isinstance(relevant, list) or not relevant:
                raise ValueError(f"{where}: 'relevant APIs' must be a non-empty list of [tool, api] pairs")
            for k, pair in enumerate(relevant):
                if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                    raise ValueError(f"{where}: 'relevant APIs'[{k}]: expected [tool_name, api_name], got {pair!r}")
                wanted.append((query_id, f"{pair[0].strip()}::{pair[1].strip()}", f"{where}: 'relevant APIs'[{k}]"))
            queries.append({"query_id": query_id, "text": text.strip(), "group": group, "source_query_id": str(record["query_id"])})
    if not queries:
        raise ValueError(f"{folder}: the query files hold no records")
    check_unique([q["query_id"] for q in queries], str(folder), "query_id", row_offset=0, unit="query")
    qrel_rows: dict[tuple[str, str], int] = {}
    for query_id, item_id, where in wanted:
        if item_id not in items:
            raise ValueError(f"{where}: relevant API {item_id!r} is in no api_list")
        if (query_id, item_id) in qrel_rows:
            dups.add("relevant APIs", f"{where}: {item_id!r} again")
        qrel_rows[(query_id, item_id)] = 1
    meta = {"files": sorted(p.name for p in folder.glob("*.json")), "conflicting_api_records": conflicts}
    return Loaded(
        pd.DataFrame(list(items.values())),
        pd.DataFrame(queries),
        _qrels([(q, i, g) for (q, i), g in qrel_rows.items()]),
        grades=(1,),
        meta=meta,
        duplicates=dups,
    )


# ---------------------------------------------------------------------------------- WANDS
@register_loader("wands")
def load_wands(source: Path, *, download: bool = False, base_url: str = WANDS_BASE_URL) -> Loaded:
    """WANDS: product.csv, query.csv, label.csv (all tab separated).

    Items = products (title = product_name, text = product_description, category =
    product_class, the other columns kept); queries keep query_class; grades Exact=2,
    Partial=1, Irrelevant=0 (Irrelevant judgements are kept as grade-0 qrels). With
    ``download=True`` the official files are fetched into ``source`` unless a size-checked
    copy is already there.
    """
    if download:
        from coevo.data.download import download_files

        download_files(base_url, WANDS_FILES, source)
    require_dir(source)
    missing = [name for name in WANDS_FILES if not (source / name).exists()]
    if missing:
        raise FileNotFoundError(
            f"{source}: missing WANDS file(s) {', '.join(missing)}; "
            "pass download=True (CLI: --download) to fetch them from github.com/wayfair/WANDS"
        )
    product_path, query_path, label_path = (source / name for name in WANDS_FILES)
    products = read_table(product_path, WANDS_PRODUCT_COLUMNS, sep="\t")
    queries = read_table(query_path, ["query_id", "query", "query_class"], sep="\t")
    labels = read_table(label_path, ["id", "query_id", "product_id", "label"], sep="\t")
    dups = Duplicates()
    check_nonempty(list(products["product_id"]), str(product_path), "product_id")
    products = _drop_repeated_rows(products, ("product_id",), product_path, "products", dups)
    check_nonempty(list(queries["query_id"]), str(query_path), "query_id")
    queries = _drop_repeated_rows(queries, ("query_id",), query_path, "queries", dups)
    check_nonempty(list(queries["query"]), str(query_path), "query")

    titles = products["product_name"].str.strip()
    untitled = titles == ""
    # A product without a name is still a judged item: name it by its class and id.
    titles = titles.where(~untitled, products["product_class"].str.strip() + " #" + products["product_id"])
    items = pd.DataFrame(
        {
            "item_id": products["product_id"],
            "title": titles,
            "text": products["product_description"].str.strip(),
            "category": products["product_class"].str.strip(),
            "category_hierarchy": products["category_hierarchy"],
            "product_features": products["product_features"],
        }
    )
    for column in ("rating_count", "average_rating", "review_count"):
        items[column] = pd.to_numeric(products[column].replace("", None), errors="coerce")

    unknown = ~labels["label"].isin(list(WANDS_GRADES))
    if unknown.any():
        row = int(unknown.to_numpy().nonzero()[0][0])
        raise ValueError(
            f"{label_path}: row {row + 2}: label {labels['label'].iloc[row]!r} is not one of {', '.join(WANDS_GRADES)}"
        )
    for column, known, path in (("query_id", queries["query_id"], query_path), ("product_id", products["product_id"], product_path)):
        dangling = ~labels[column].isin(set(known))
        if dangling.any():
            row = int(dangling.to_numpy().nonzero()[0][0])
            raise ValueError(
                f"{label_path}: row {row + 2}: {column} {labels[column].iloc[row]!r} is not in {path.name} "
                f"({int(dangling.sum())} such rows)"
            )
    qrels = pd.DataFrame(
        {"query_id": labels["query_id"], "item_id": labels["product_id"], "grade": labels["label"].map(WANDS_GRADES)}
    )
    # Repeated judgements of one pair: keep the highest grade, once (reported as duplicates).
    n_before = len(qrels)
    repeated = qrels.duplicated(subset=["query_id", "item_id"], keep="first").to_numpy().nonzero()[0]
    for row in repeated[:DUPLICATE_EXAMPLES]:
        dups.add("judgements", f"{label_path.name}: row {row + 2}: query_id {qrels['query_id'].iloc[row]!r} "
                               f"product_id {qrels['item_id'].iloc[row]!r} judged again")
    if len(repeated) > DUPLICATE_EXAMPLES:
        dups.add("judgements", "", count=len(repeated) - DUPLICATE_EXAMPLES)
    qrels = qrels.groupby(["query_id", "item_id"], sort=False, as_index=False)["grade"].max()
    meta = {"untitled_products": int(untitled.sum()), "repeated_judgements": n_before - len(qrels)}
    query_frame = pd.DataFrame(
        {"query_id": queries["query_id"], "text": queries["query"].str.strip(), "query_class": queries["query_class"]}
    )
    return Loaded(items, query_frame, _qrels(list(qrels.itertuples(index=False, name=None))), grades=(0, 1, 2), meta=meta,
                  duplicates=dups)


# ---------------------------------------------------------------------------------- BEIR
@register_loader("beir")
def load_beir(source: Path) -> Loaded:
    """A BEIR folder: corpus.jsonl (_id, title, text), queries.jsonl (_id, text), qrels/*.tsv.

    Each qrels file (query-id, corpus-id, score) names its split: train, dev/val/validation
    -> val, test; a source without dev qrels gets a seeded val carved from train (see
    :func:`load_source`). Only judged queries are kept. A document without a title gets its
    ``_id`` as title: the contract needs a non-empty title, and filling it from the text
    would make BM25 count those words twice (``meta.untitled_docs`` counts them). A line
    repeating an earlier document or query exactly, and a repeated (query, document)
    judgement (the highest score kept), are duplicates; the same ``_id`` with other content
    is an error.
    """
    require_dir(source)
    corpus_path, queries_path, qrels_dir = source / "corpus.jsonl", source / "queries.jsonl", source / "qrels"
    dups = Duplicates()
    items: dict[str, dict[str, str]] = {}
    first_line: dict[str, int] = {}
    untitled = 0
    for lineno, record in read_jsonl(corpus_path):
        where = f"{corpus_path}: line {lineno}"
        require_fields(record, ("_id", "text"), where)
        item_id = str(record["_id"])
        title = str(record.get("title") or "").strip()
        text = str(record["text"] or "").strip()
        if not title and not text:
            raise ValueError(f"{where}: empty 'title' and 'text'")
        row = {"item_id": item_id, "title": title, "text": text}
        if item_id in items:
            if items[item_id] != row:
                raise ValueError(f"{where}: duplicate _id {item_id!r} (first at line {first_line[item_id]}) "
                                 "with different fields (the same id must mean the same record)")
            dups.add("documents", f"{corpus_path.name}: line {lineno}: _id {item_id!r} again (first at line "
                                  f"{first_line[item_id]})")
            continue
        items[item_id], first_line[item_id] = row, lineno
    for row in items.values():
        if not row["title"]:
            untitled += 1
            row["title"] = row["item_id"]
    query_text: dict[str, str] = {}
    query_line: dict[str, int] = {}
    for lineno, record in read_jsonl(queries_path):
        where = f"{queries_path}: line {lineno}"
        require_fields(record, ("_id", "text"), where)
        qid = str(record["_id"])
        text = str(record["text"] or "").strip()
        if not text:
            raise ValueError(f"{where}: empty 'text'")
        if qid in query_text:
            if query_text[qid] != text:
                raise ValueError(f"{where}: duplicate _id {qid!r} (first at line {query_line[qid]}) with another text")
            dups.add("queries", f"{queries_path.name}: line {lineno}: _id {qid!r} again (first at line {query_line[qid]})")
            continue
        query_text[qid], query_line[qid] = text, lineno

    require_dir(qrels_dir, "qrels folder")
    files = sorted(qrels_dir.glob("*.tsv"))
    if not files:
        raise FileNotFoundError(f"{qrels_dir}: no qrels/*.tsv files")
    split_of: dict[str, tuple[str, str]] = {}
    grade_of: dict[tuple[str, str], int] = {}
    judged_at: dict[tuple[str, str], str] = {}
    for path in files:
        if path.stem not in BEIR_SPLITS:
            raise ValueError(f"{path}: file name must give the split ({', '.join(f'{k}.tsv' for k in BEIR_SPLITS)})")
        split = BEIR_SPLITS[path.stem]
        table = read_table(path, ["query-id", "corpus-id", "score"], sep="\t")
        for row, (qid, iid, score) in enumerate(zip(table["query-id"], table["corpus-id"], table["score"]), start=2):
            if qid not in query_text:
                raise ValueError(f"{path}: row {row}: query-id {qid!r} is not in {queries_path.name}")
            if iid not in items:
                raise ValueError(f"{path}: row {row}: corpus-id {iid!r} is not in {corpus_path.name}")
            try:
                grade = int(score)
            except ValueError:
                raise ValueError(f"{path}: row {row}: score {score!r} is not an integer") from None
            earlier = split_of.setdefault(qid, (split, path.name))
            if earlier[0] != split:
                raise ValueError(f"{path}: row {row}: query {qid!r} is also judged in {earlier[1]} (one split per query)")
            pair = (qid, iid)
            if pair in grade_of:
                dups.add("judgements", f"{path.name}: row {row}: ({qid!r}, {iid!r}) judged again (first at "
                                       f"{judged_at[pair]}; the highest score is kept)")
                grade_of[pair] = max(grade_of[pair], grade)
                continue
            grade_of[pair], judged_at[pair] = grade, f"{path.name} row {row}"
    qrels = _qrels([(q, i, g) for (q, i), g in grade_of.items()])
    judged = [q for q in query_text if q in split_of]
    queries = pd.DataFrame(
        {"query_id": judged, "text": [query_text[q] for q in judged], "split": [split_of[q][0] for q in judged]}
    )
    grades = tuple(sorted(set(int(g) for g in qrels["grade"]))) or (1,)
    meta = {"qrels_files": [p.name for p in files], "unjudged_queries_dropped": len(query_text) - len(judged),
            "untitled_docs": untitled, "untitled_docs_title": "the document _id"}
    return Loaded(pd.DataFrame(list(items.values())), queries, qrels, grades=grades, meta=meta, duplicates=dups)


# ---------------------------------------------------------------------------------- image captions
@register_loader("image_captions")
def load_image_captions(source: Path, *, lang: str | None = None) -> Loaded:
    """Flickr8k-CN layout: captions.tsv (image, split, lang, idx, caption) + images/.

    Items are images (item_id = title = file name, text empty, image_path absolute, split);
    queries are captions (query_id = "image#lang#idx", lang kept), each relevant to its
    image. ``lang`` keeps one language's captions only. Rows with an empty split go to train.
    """
    require_dir(source)
    tsv = source / "captions.tsv"
    images_dir = require_dir(source / "images", "images folder")
    table = read_table(tsv, ["image", "split", "lang", "idx", "caption"], sep="\t")
    check_nonempty(list(table["image"]), str(tsv), "image")
    check_nonempty(list(table["caption"]), str(tsv), "caption")
    split = table["split"].str.strip().replace({"dev": "val", "validation": "val"})
    # Flickr8k-CN leaves a few images without a split (9 of the 1,000 here): they train, so
    # the official val/test sets stay exactly as published.
    unsplit = split == ""
    unsplit_images = sorted(set(table.loc[unsplit, "image"]))
    split = split.where(~unsplit, "train")
    bad = ~split.isin(SPLITS)
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise ValueError(f"{tsv}: row {row + 2}: split {table['split'].iloc[row]!r} is not one of train, val, test")
    table = table.assign(split=split, row=range(2, len(table) + 2))
    if lang is not None:
        available = sorted(set(table["lang"]))
        table = table[table["lang"] == lang]
        if table.empty:
            raise ValueError(f"{tsv}: no captions in language {lang!r} (the file has {', '.join(available)})")

    image_split: dict[str, tuple[str, int]] = {}
    for image, img_split, row in zip(table["image"], table["split"], table["row"]):
        earlier = image_split.setdefault(image, (img_split, row))
        if earlier[0] != img_split:
            raise ValueError(f"{tsv}: row {row}: image {image!r} is in split {img_split!r} here but {earlier[0]!r} at row {earlier[1]}")
    for image, (_, row) in image_split.items():
        if not (images_dir / image).is_file():
            raise FileNotFoundError(f"{tsv}: row {row}: image file {images_dir / image} does not exist")
    dups = Duplicates()
    table = table.assign(query_id=table["image"] + "#" + table["lang"] + "#" + table["idx"])
    repeated = table.duplicated(subset=["query_id"], keep="first").to_numpy()
    if repeated.any():
        first_row = dict(zip(table.loc[~repeated, "query_id"], table.loc[~repeated, "row"]))
        first_caption = dict(zip(table.loc[~repeated, "query_id"], table.loc[~repeated, "caption"]))
        for qid, caption, row in table.loc[repeated, ["query_id", "caption", "row"]].itertuples(index=False):
            where = f"row {row}: duplicate caption {qid!r} (image#lang#idx; first at row {first_row[qid]})"
            if caption.strip() != first_caption[qid].strip():
                raise ValueError(f"{tsv}: {where} with another text")
            dups.add("captions", f"{tsv.name}: {where}")
        table = table[~repeated]
    query_ids = table["query_id"].tolist()
    items = pd.DataFrame(
        {
            "item_id": list(image_split),
            "title": list(image_split),
            "text": "",
            "image_path": [str((images_dir / image).resolve()) for image in image_split],
            "split": [s for s, _ in image_split.values()],
        }
    )
    queries = pd.DataFrame(
        {"query_id": query_ids, "text": table["caption"].str.strip().tolist(), "split": table["split"].tolist(), "lang": table["lang"].tolist()}
    )
    qrels = _qrels([(q, image, 1) for q, image in zip(query_ids, table["image"])])
    meta = {"lang": lang, "images_dir": str(images_dir.resolve()), "images_without_split_to_train": len(unsplit_images)}
    return Loaded(items, queries, qrels, grades=(1,), meta=meta, duplicates=dups)


# ------------------------------------------------------------------------------ prepared
@register_loader("prepared")
def load_prepared(source: Path) -> Loaded:
    """A prepared data set folder (items, queries and qrels parquet, dataset.json), as
    ``coevo data prepare`` writes it: its tables and train/val/test splits are kept as they are
    (split "from source"), so a team's own data, converted once, trains and is measured like a
    public set. Vague copies a prepare step added (split ``vague``, or ids ending ``~vague`` in train
    and val) are left out: ``data.vague`` derives them again by its fixed rule."""
    from coevo.data.vague import VAGUE_SUFFIX
    from coevo.data.schema import Dataset

    dataset = Dataset.load(require_dir(source))
    queries = dataset.queries[dataset.queries["split"].isin(("train", "val", "test"))
                              & ~dataset.queries["query_id"].astype(str).str.endswith(VAGUE_SUFFIX)].reset_index(drop=True)
    qrels = dataset.qrels[dataset.qrels["query_id"].isin(set(queries["query_id"]))].reset_index(drop=True)
    return Loaded(items=dataset.items, queries=queries, qrels=qrels, grades=dataset.grades,
                  meta={"prepared_from": dataset.name})
