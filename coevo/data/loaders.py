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
- image_captions: items are images, queries are captions; the split comes from the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from coevo.data.readers import (
    check_nonempty,
    check_unique,
    first_duplicate,
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


@dataclass
class Loaded:
    """What a loader returns; ``queries`` has a ``split`` column only when the source fixes one."""

    items: pd.DataFrame
    queries: pd.DataFrame
    qrels: pd.DataFrame
    grades: tuple[int, ...] = (1,)
    meta: dict[str, Any] = field(default_factory=dict)


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
    **options: Any,
) -> Dataset:
    """Read ``source`` with the loader registered as ``loader`` into a :class:`Dataset`.

    ``options`` go to the loader (metatool: include_multi_tool; wands: download, base_url;
    image_captions: lang).
    """
    if loader not in LOADERS:
        raise ValueError(f"unknown loader {loader!r}; expected one of {', '.join(sorted(LOADERS))}")
    source = Path(source)
    try:
        loaded = LOADERS[loader](source, **options)
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc):
            raise ValueError(f"loader {loader!r}: unknown option ({exc})") from None
        raise
    queries = loaded.queries.copy()
    if "split" in queries.columns:
        split_rule = "from source"
    else:
        split_rule = f"seeded (seed {seed}, val {val_fraction}, test {test_fraction}, stratified by group)"
        queries["split"] = assign_splits(
            queries, loaded.qrels, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction
        )
    meta = {"loader": loader, "options": {k: v for k, v in options.items()}, "split": split_rule, **loaded.meta}
    return Dataset(
        items=loaded.items,
        queries=queries,
        qrels=loaded.qrels,
        name=name or loader,
        source=str(source),
        seed=seed,
        grades=loaded.grades,
        meta=meta,
    )


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
    for row, (query, tool) in enumerate(zip(pairs["Query"], pairs["Tool"]), start=2):
        query, tool = query.strip(), tool.strip()
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
    meta = {"pairs_in_csv": len(pairs), "multi_tool_queries": n_multi}
    return Loaded(items, queries, qrels, grades=(1,), meta=meta)


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
        qrel_rows[(query_id, item_id)] = 1
    meta = {"files": sorted(p.name for p in folder.glob("*.json")), "conflicting_api_records": conflicts}
    return Loaded(
        pd.DataFrame(list(items.values())),
        pd.DataFrame(queries),
        _qrels([(q, i, g) for (q, i), g in qrel_rows.items()]),
        grades=(1,),
        meta=meta,
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
    check_nonempty(list(products["product_id"]), str(product_path), "product_id")
    check_unique(list(products["product_id"]), str(product_path), "product_id")
    check_nonempty(list(queries["query_id"]), str(query_path), "query_id")
    check_unique(list(queries["query_id"]), str(query_path), "query_id")
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
    # Repeated judgements of one pair: keep the highest grade, once.
    n_before = len(qrels)
    qrels = qrels.groupby(["query_id", "item_id"], sort=False, as_index=False)["grade"].max()
    meta = {"untitled_products": int(untitled.sum()), "repeated_judgements": n_before - len(qrels)}
    query_frame = pd.DataFrame(
        {"query_id": queries["query_id"], "text": queries["query"].str.strip(), "query_class": queries["query_class"]}
    )
    return Loaded(items, query_frame, _qrels(list(qrels.itertuples(index=False, name=None))), grades=(0, 1, 2), meta=meta)


# ---------------------------------------------------------------------------------- BEIR
def _short_title(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


@register_loader("beir")
def load_beir(source: Path) -> Loaded:
    """A BEIR folder: corpus.jsonl (_id, title, text), queries.jsonl (_id, text), qrels/*.tsv.

    Each qrels file (query-id, corpus-id, score) names its split: train, dev/val/validation
    -> val, test. Only judged queries are kept. A document without a title gets the start of
    its text as title (the contract needs a non-empty title).
    """
    require_dir(source)
    corpus_path, queries_path, qrels_dir = source / "corpus.jsonl", source / "queries.jsonl", source / "qrels"
    items, item_ids = [], []
    untitled = 0
    for lineno, record in read_jsonl(corpus_path):
        where = f"{corpus_path}: line {lineno}"
        require_fields(record, ("_id", "text"), where)
        title = str(record.get("title") or "").strip()
        text = str(record["text"] or "").strip()
        if not title:
            untitled += 1
            title = _short_title(text)
        if not title:
            raise ValueError(f"{where}: empty 'title' and 'text'")
        items.append({"item_id": str(record["_id"]), "title": title, "text": text})
        item_ids.append((str(record["_id"]), lineno))
    check_unique([i for i, _ in item_ids], str(corpus_path), "_id", row_offset=1, unit="record")
    query_text: dict[str, str] = {}
    for lineno, record in read_jsonl(queries_path):
        where = f"{queries_path}: line {lineno}"
        require_fields(record, ("_id", "text"), where)
        qid = str(record["_id"])
        if qid in query_text:
            raise ValueError(f"{where}: duplicate _id {qid!r}")
        text = str(record["text"] or "").strip()
        if not text:
            raise ValueError(f"{where}: empty 'text'")
        query_text[qid] = text

    require_dir(qrels_dir, "qrels folder")
    files = sorted(qrels_dir.glob("*.tsv"))
    if not files:
        raise FileNotFoundError(f"{qrels_dir}: no qrels/*.tsv files")
    known_items = {i for i, _ in item_ids}
    split_of: dict[str, tuple[str, str]] = {}
    rows: list[tuple[str, str, int]] = []
    for path in files:
        if path.stem not in BEIR_SPLITS:
            raise ValueError(f"{path}: file name must give the split ({', '.join(f'{k}.tsv' for k in BEIR_SPLITS)})")
        split = BEIR_SPLITS[path.stem]
        table = read_table(path, ["query-id", "corpus-id", "score"], sep="\t")
        for row, (qid, iid, score) in enumerate(zip(table["query-id"], table["corpus-id"], table["score"]), start=2):
            if qid not in query_text:
                raise ValueError(f"{path}: row {row}: query-id {qid!r} is not in {queries_path.name}")
            if iid not in known_items:
                raise ValueError(f"{path}: row {row}: corpus-id {iid!r} is not in {corpus_path.name}")
            try:
                grade = int(score)
            except ValueError:
                raise ValueError(f"{path}: row {row}: score {score!r} is not an integer") from None
            earlier = split_of.setdefault(qid, (split, path.name))
            if earlier[0] != split:
                raise ValueError(f"{path}: row {row}: query {qid!r} is also judged in {earlier[1]} (one split per query)")
            rows.append((qid, iid, grade))
    qrels = _qrels(rows).drop_duplicates(["query_id", "item_id"], keep="last")
    judged = [q for q in query_text if q in split_of]
    queries = pd.DataFrame(
        {"query_id": judged, "text": [query_text[q] for q in judged], "split": [split_of[q][0] for q in judged]}
    )
    grades = tuple(sorted(set(int(g) for g in qrels["grade"]))) or (1,)
    meta = {"qrels_files": [p.name for p in files], "unjudged_queries_dropped": len(query_text) - len(judged), "untitled_docs": untitled}
    return Loaded(pd.DataFrame(items), queries, qrels, grades=grades, meta=meta)


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
    query_ids = (table["image"] + "#" + table["lang"] + "#" + table["idx"]).tolist()
    dup = first_duplicate(query_ids)
    if dup is not None:
        first, again = (int(table["row"].iloc[i]) for i in dup)
        raise ValueError(f"{tsv}: row {again}: duplicate caption {query_ids[dup[1]]!r} (image#lang#idx; first at row {first})")
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
    return Loaded(items, queries, qrels, grades=(1,), meta=meta)
