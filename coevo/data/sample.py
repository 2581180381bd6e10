"""Build the embedded samples (data/sample/<name>/) from the full public sets, deterministically.

Each sample keeps its source's raw file layout, so the ordinary loader reads it, and ships the
source's licence and an ATTRIBUTION.md that says what was taken and the command that rebuilt it.
Query texts and tool names are copied byte for byte; only whole records are dropped.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coevo import io
from coevo.data.readers import read_json, read_table, read_text, require_dir

SAMPLES: dict[str, Callable[..., dict[str, Any]]] = {}

METATOOL_SOURCE = "GitHub HowieHwong/MetaTool, commit 35e81bb"
STABLETOOLBENCH_SOURCE = "GitHub THUNLP-MT/StableToolBench, commit aa4ed9f (solvable_queries/)"


def _register(name: str) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    def wrap(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        SAMPLES[name] = fn
        return fn

    return wrap


def build_sample(name: str, source: str | Path, out: str | Path, **options: Any) -> dict[str, Any]:
    """Write the sample ``name`` from the full set at ``source`` into ``out``; return its counts."""
    if name not in SAMPLES:
        raise ValueError(f"unknown sample {name!r}; expected one of {', '.join(sorted(SAMPLES))}")
    return SAMPLES[name](Path(source), Path(out), **options)


def _copy_license(source: Path, out: Path) -> None:
    licence = source / "LICENSE"
    if not licence.is_file():
        raise FileNotFoundError(f"{licence}: the source's licence must travel with the sample, but it is missing")
    with io.atomic_path(out / "LICENSE") as tmp:
        shutil.copyfile(licence, tmp)


@_register("metatool")
def build_metatool_sample(
    source: Path,
    out: Path,
    *,
    seed: int = 42,
    n_tools: int = 40,
    n_multi_tools: int = 8,
    queries_per_tool: int = 8,
    max_multi_queries: int = 20,
) -> dict[str, Any]:
    """A MetaTool subset in MetaTool's raw format.

    ``n_tools`` tools are drawn with ``seed``; ``n_multi_tools`` of them from the tools of
    multi_tool_query_golden.json so that multi-tool queries survive. Per tool,
    ``queries_per_tool`` queries whose every tool is in the subset; every CSV row of a kept
    query is kept (so a query listed with two tools keeps both). Up to ``max_multi_queries``
    multi-tool queries whose tools are all in the subset.
    """
    require_dir(source)
    csv_path = source / "all_clean_data.csv"
    pairs = read_table(csv_path, ["Query", "Tool"])
    descriptions: dict[str, str] = read_json(source / "plugin_des.json")
    multi_path = source / "multi_tool_query_golden.json"
    multi: list[dict[str, Any]] = read_json(multi_path) if multi_path.exists() else []
    rng = random.Random(seed)

    multi_tools = sorted({t for record in multi for t in record["tool"]})
    picked = set(rng.sample(multi_tools, min(n_multi_tools, len(multi_tools))))
    others = sorted(set(descriptions) - picked)
    picked |= set(rng.sample(others, max(0, min(n_tools - len(picked), len(others)))))
    tools = [t for t in descriptions if t in picked]  # plugin_des.json order

    tools_of: dict[str, set[str]] = {}
    for query, tool in zip(pairs["Query"], pairs["Tool"]):
        tools_of.setdefault(query.strip(), set()).add(tool.strip())
    candidates = sorted(q for q, ts in tools_of.items() if ts <= picked)
    kept: set[str] = set()
    for tool in tools:
        mine = [q for q in candidates if tool in tools_of[q] and q not in kept]
        rng.shuffle(mine)
        kept.update(mine[:queries_per_tool])
    rows = pairs[pairs["Query"].str.strip().isin(kept)]

    fitting = [r for r in multi if set(r["tool"]) <= picked]
    chosen = set(rng.sample(range(len(fitting)), min(max_multi_queries, len(fitting))))
    multi_kept = [r for i, r in enumerate(fitting) if i in chosen]

    out.mkdir(parents=True, exist_ok=True)
    with io.atomic_path(out / "all_clean_data.csv") as tmp:
        rows.to_csv(tmp, index=False)
    io.write_text(out / "plugin_des.json", json.dumps({t: descriptions[t] for t in tools}, indent=2, ensure_ascii=False) + "\n")
    if multi:
        io.write_text(out / "multi_tool_query_golden.json", json.dumps(multi_kept, indent=4, ensure_ascii=False) + "\n")
    _copy_license(source, out)
    counts = {"tools": len(tools), "csv_rows": len(rows), "queries": len(kept), "multi_tool_queries": len(multi_kept)}
    command = f"coevo data build-sample metatool --source {source} --out {out} --seed {seed}"
    io.write_text(out / "ATTRIBUTION.md", f"""# MetaTool sample (embedded)

A small subset of the ToolE data of **MetaTool** (Huang et al., "MetaTool Benchmark for Large
Language Models: Deciding Whether to Use Tools and Which to Use", ICLR 2024), kept in its raw
file format so that `coevo data prepare metatool --source {out}` reads it like the full set.

- Source: {METATOOL_SOURCE}, files `all_clean_data.csv`, `plugin_des.json`,
  `multi_tool_query_golden.json`.
- Licence: MIT, copyright (c) 2023 Yue Huang; the licence text is in `LICENSE` beside this file.
- Subset (seed {seed}): {counts['tools']} of {len(descriptions)} tools, {min(n_multi_tools, len(multi_tools))} of them drawn from the
  {len(multi_tools)} tools of the multi-tool queries; up to {queries_per_tool} queries per tool among the queries
  whose every tool is in the subset ({counts['queries']} queries, {counts['csv_rows']} CSV rows); {counts['multi_tool_queries']} of the
  {len(multi)} multi-tool queries whose tools are all in the subset (at most {max_multi_queries}).
  Rows and texts are copied unchanged; nothing was edited.
- Rebuilt with: `{command}`
""")
    return counts


@_register("stabletoolbench")
def build_stabletoolbench_sample(source: Path, out: Path, *, seed: int = 42, per_group: int = 15) -> dict[str, Any]:
    """``per_group`` seeded query records from every group file, each with its full api_list."""
    require_dir(source)
    folder = source / "solvable_queries" / "test_instruction"
    ids_folder = source / "solvable_queries" / "test_query_ids"
    require_dir(folder, "StableToolBench query folder")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.json group files")
    counts: dict[str, Any] = {}
    for path in files:
        records = read_json(path)
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected a JSON list of query records")
        rng = random.Random(f"{seed}:{path.stem}")
        keep = sorted(rng.sample(range(len(records)), min(per_group, len(records))))
        subset = [records[i] for i in keep]
        io.write_text(out / "solvable_queries" / "test_instruction" / path.name, json.dumps(subset, indent=1, ensure_ascii=False) + "\n")
        if (ids_folder / path.name).is_file():
            read_text(ids_folder / path.name)  # strict UTF-8 check before reuse
            ids = {str(r.get("query_id")): 0 for r in subset}
            io.write_text(out / "solvable_queries" / "test_query_ids" / path.name, json.dumps(ids, indent=4) + "\n")
        counts[path.stem] = len(subset)
    _copy_license(source, out)
    total = sum(counts.values())
    command = f"coevo data build-sample stabletoolbench --source {source} --out {out} --seed {seed}"
    per_file = ", ".join(f"{g}: {n}" for g, n in counts.items())
    io.write_text(out / "ATTRIBUTION.md", f"""# StableToolBench sample (embedded)

A small subset of the solvable test queries of **StableToolBench** (Guo et al., "StableToolBench:
Towards Stable Large-Scale Benchmarking on Tool Learning of Large Language Models", 2024),
built on ToolBench (Qin et al., ICLR 2024), in its raw layout
(`solvable_queries/test_instruction/<group>.json`, `solvable_queries/test_query_ids/<group>.json`)
so that `coevo data prepare stabletoolbench --source {out}` reads it like the full set.

- Source: {STABLETOOLBENCH_SOURCE}.
- Licence: Apache License 2.0; the licence text is in `LICENSE` beside this file.
- Subset (seed {seed}): {per_group} query records drawn per group file ({total} in all: {per_file}),
  each copied whole with its `api_list` and `relevant APIs`; `test_query_ids` lists the kept ids.
  Records are unchanged; the JSON is re-indented (one space) to keep the files small.
- Rebuilt with: `{command}`
""")
    return {"queries": total, "per_group": counts}


def toy_metatool(source: Path, dest: Path, *, tools: int = 6, queries_per_tool: int = 8) -> Path:
    """A MetaTool-format subset of ``source`` (a MetaTool folder): its first ``tools`` tools, the first
    ``queries_per_tool`` queries of each; the toy project of the flow tests and of bench/staleness_table.py."""
    descriptions = json.loads((source / "plugin_des.json").read_text())
    with (source / "all_clean_data.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    names = list(dict.fromkeys(r["Tool"] for r in rows))[:tools]
    keep = [r for t in names for r in [r for r in rows if r["Tool"] == t][:queries_per_tool]]
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / "all_clean_data.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["Query", "Tool"])
        writer.writeheader()
        writer.writerows(keep)
    (dest / "plugin_des.json").write_text(json.dumps({t: descriptions[t] for t in names}))
    return dest
