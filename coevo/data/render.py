"""Render a tool (one StableToolBench (tool, API) row of the items table) as text.

CoHyDE trains the encoder and warms the rewriter on tools written in five formats, so that
neither model over-fits one layout of the record:

1. ``title``          the tool title only
2. ``title_api``      + the API name
3. ``title_api_tool`` + the tool description (empty descriptions keep just the names)
4. ``title_api_desc`` title + API name + API description
5. ``full``           the full record (category, tool, API, both descriptions, parameters)

A row is any mapping (dict, pandas Series) with the items-table columns; the StableToolBench
columns (``tool_name``, ``api_name``, ``api_description``, ``tool_description``, ``category``,
``parameters`` as a JSON string) are used when present, else ``title``/``text`` stand in.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

FORMATS: tuple[str, ...] = ("title", "title_api", "title_api_tool", "title_api_desc", "full")


def _field(row: Mapping[str, Any], name: str) -> str:
    """A text column, '' when absent, None or NaN (parquet nulls come back as NaN)."""
    value = row.get(name) if hasattr(row, "get") else None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return " ".join(str(value).split())


def _item_id(row: Mapping[str, Any]) -> str:
    return _field(row, "item_id") or "<no item_id>"


def _title(row: Mapping[str, Any]) -> str:
    title = _field(row, "tool_name") or _field(row, "title")
    if not title:
        raise ValueError(f"item {_item_id(row)!r}: neither 'tool_name' nor 'title' is set; cannot render the tool")
    return title


def _api_description(row: Mapping[str, Any]) -> str:
    # The loader keeps the API description in `text` as well; prefer the explicit column.
    return _field(row, "api_description") or _field(row, "text")


def _parameters(row: Mapping[str, Any]) -> str:
    """Render the JSON parameter list as `name (type, required): description; ...`."""
    raw = row.get("parameters") if hasattr(row, "get") else None
    if raw is None or (isinstance(raw, float) and math.isnan(raw)) or raw == "":
        return ""
    if isinstance(raw, str):
        try:
            params = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"item {_item_id(row)!r}: field 'parameters' is not valid JSON ({exc.msg})") from None
    else:
        params = raw
    if isinstance(params, Mapping):
        # {"required": [...], "optional": [...]} layout
        flat = [(p, "required") for p in params.get("required", params.get("required_parameters", []))]
        flat += [(p, "optional") for p in params.get("optional", params.get("optional_parameters", []))]
    elif isinstance(params, Sequence) and not isinstance(params, str):
        flat = [(p, "required" if (isinstance(p, Mapping) and p.get("required")) else "") for p in params]
    else:
        raise ValueError(f"item {_item_id(row)!r}: field 'parameters' must be a JSON list or object, got {params!r}")
    parts = []
    for param, status in flat:
        if not isinstance(param, Mapping):
            parts.append(str(param))
            continue
        name = " ".join(str(param.get("name", "?")).split())
        attrs = ", ".join(a for a in (str(param.get("type", "") or ""), status) if a)
        desc = " ".join(str(param.get("description", "") or "").split())
        label = f"{name} ({attrs})" if attrs else name
        parts.append(f"{label}: {desc}" if desc else label)
    return "; ".join(parts)


def render_tool(row: Mapping[str, Any], fmt: str) -> str:
    """The tool in one of :data:`FORMATS`; raises ValueError naming the item on bad input."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool format {fmt!r}; expected one of {', '.join(FORMATS)}")
    title = _title(row)
    api = _field(row, "api_name")
    if fmt == "title":
        return title
    head = f"{title}: {api}" if api else title
    if fmt == "title_api":
        return head
    if fmt == "title_api_tool":
        tool_desc = _field(row, "tool_description")
        return f"{head}. {tool_desc}" if tool_desc else head
    if fmt == "title_api_desc":
        api_desc = _api_description(row)
        return f"{head}. {api_desc}" if api_desc else head
    lines = []
    for label, value in (
        ("Category", _field(row, "category")),
        ("Tool", title),
        ("Tool description", _field(row, "tool_description")),
        ("API", api),
        ("API description", _api_description(row)),
        ("Parameters", _parameters(row)),
    ):
        if value:
            lines.append(f"{label}: {value}")
    return "\n".join(lines)


def render_all(row: Mapping[str, Any]) -> list[str]:
    """The tool in every format, in :data:`FORMATS` order."""
    return [render_tool(row, fmt) for fmt in FORMATS]


def render_random(row: Mapping[str, Any], rng: random.Random) -> str:
    """The tool in a format drawn uniformly from :data:`FORMATS` with ``rng``."""
    return render_tool(row, rng.choice(FORMATS))
