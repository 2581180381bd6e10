"""`coevo params explain|show`: the documented parameter tree and the merged params."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from coevo.cli.common import console, user_errors

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from coevo.config import Params

app = typer.Typer(
    help="Inspect parameters: what each knob does, what it accepts, and its value after merging "
    "params files and --set overrides.",
    no_args_is_help=True,
)

PARAMS_HELP = (
    "Params file; repeat to layer files, later ones win (e.g. -p params.yaml -p params/demo.yaml). "
    "Default: params.yaml."
)
SET_HELP = "Override a param, KEY=VALUE (repeatable, applied after the files), e.g. cogr.rounds=1."


def _load(params: Optional[list[Path]], set_: list[str]) -> "Params":
    from coevo.config import load_params

    return load_params(params or [Path("params.yaml")], set_)


# ------------------------------------------------------------------------ type text
def _constraints(info: "FieldInfo") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in info.metadata:
        for name in ("ge", "gt", "le", "lt", "min_length"):
            value = getattr(item, name, None)
            if value is not None:
                found[name] = value
    return found


def _range_text(bounds: dict[str, Any]) -> str:
    low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    high = (bounds["le"], "]") if "le" in bounds else (bounds["lt"], ")") if "lt" in bounds else None
    if low and high:
        return f" in {low[0]}{low[1]}, {high[0]}{high[1]}"
    if low:
        return f" {'>=' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f" {'<=' if high[1] == ']' else '<'} {high[0]}"
    return ""


def _base_text(annotation: Any) -> str:
    from coevo.config import Section

    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _base_text(args[0])
    if origin is typing.Literal:
        return "one of: " + " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_base_text(a) for a in args)
    if origin is list:
        return f"list of {_base_text(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def type_text(info: "FieldInfo", key: str = "") -> str:
    """What a field accepts, e.g. ``int >= 1 | null``, ``float in (0, 5]``, ``one of: val | test``."""
    from coevo.config import TrainerSection, field_at

    annotation = info.annotation
    if key.endswith(".trl") and typing.get_origin(annotation) is dict:
        parent = field_at(key.rsplit(".", 1)[0])
        owner = getattr(parent, "annotation", None)
        if isinstance(owner, type) and issubclass(owner, TrainerSection):
            return f"mapping: trl.{owner.trl_config} fields"
    text = _base_text(annotation)
    bounds = _constraints(info)
    length = bounds.pop("min_length", None)
    suffix = _range_text(bounds)
    if length:
        if text.startswith("list"):
            suffix += f" (at least {length} item{'s' if length > 1 else ''})"
        else:
            suffix += " (non-empty)" if length == 1 else f" (at least {length} characters)"
    if suffix and text.endswith(" | null"):
        return text[: -len(" | null")] + suffix + " | null"
    return text + suffix


def value_text(value: Any) -> str:
    import yaml
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return ""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return text[: -len("...")].strip() if text.endswith("...") else text


def _value_at(params: "Params", key: str) -> Any:
    node: Any = params
    for part in key.split("."):
        node = getattr(node, part) if not isinstance(node, dict) else node[part]
    return node


# ----------------------------------------------------------------------- commands
@app.command()
def explain(
    key: Optional[str] = typer.Argument(
        None, help="A dotted key: a section (cogr.grpo) or a knob (cogr.grpo.beta); the whole tree when omitted. "
        "Under a trl mapping, a TRL config field (cogr.grpo.trl.loss_type) prints TRL's own help."
    ),
    params: Optional[list[Path]] = typer.Option(None, "--params", "-p", help=PARAMS_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Print each knob: key, what it accepts (type, choices, range), its current value, what it does.

    Examples: `coevo params explain`, `coevo params explain cogr.grpo`,
    `coevo params explain cogr.early_stopping.metric`, `coevo params explain cogr.grpo.trl.loss_type`.
    """
    with user_errors():
        from coevo.config import ParamsError, close_matches, field_at, walk

        loaded = _load(params, set_)
        if key is not None and field_at(key) is None:
            trl_key = _trl_field_key(key)
            if trl_key is not None:
                _explain_trl_field(loaded, *trl_key)
                return
            raise ParamsError(f"unknown key {key!r}{close_matches(key, [k for k, _ in walk()])}")
        rows = [(k, info) for k, info in walk() if key is None or k == key or k.startswith(key + ".")]
        if key is not None and len(rows) == 1:
            _print_leaf(loaded, key, rows[0][1])
            return
        _print_table(loaded, rows)


def _print_table(loaded: "Params", rows: list[tuple[str, "FieldInfo"]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from coevo.config import section_type

    table = Table(show_lines=False, header_style="bold", pad_edge=False)
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("accepts", overflow="fold")
    table.add_column("value", overflow="fold")
    table.add_column("what it does", overflow="fold")
    for k, info in rows:
        if section_type(info.annotation) is not None:
            table.add_row(f"[bold]{k}[/]", "section", "", f"[bold]{escape(info.description or '')}[/]")
        else:
            table.add_row(k, escape(type_text(info, k)), escape(value_text(_value_at(loaded, k))),
                          escape(info.description or ""))
    console.print(table)
    console.print(
        "Change a knob with --set KEY=VALUE or in a params file layered with --params. A trl mapping takes any "
        "field of TRL's config class: `coevo params explain cogr.grpo.trl.FIELD` prints TRL's help for it.",
        highlight=False, soft_wrap=False,
    )


def _print_leaf(loaded: "Params", key: str, info: "FieldInfo") -> None:
    from rich.markup import escape
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    grid.add_row("key", f"[cyan]{key}[/]")
    grid.add_row("accepts", escape(type_text(info, key)))
    grid.add_row("value", escape(value_text(_value_at(loaded, key))))
    grid.add_row("what it does", escape(info.description or ""))
    console.print(grid, highlight=False)


def _trl_field_key(key: str) -> tuple[str, str] | None:
    """(section key, TRL field) when ``key`` is ``<trainer section>.trl.<field>``."""
    from coevo.config import TrainerSection, field_at

    head, sep, name = key.partition(".trl.")
    if not sep or not name or "." in name:
        return None
    owner = getattr(field_at(head), "annotation", None)
    if isinstance(owner, type) and issubclass(owner, TrainerSection):
        return head, name
    return None


def _explain_trl_field(loaded: "Params", section_key: str, name: str) -> None:
    import dataclasses

    import trl
    from rich.markup import escape
    from rich.table import Table

    from coevo.config import ParamsError, trl_field_types, type_name, close_matches

    section = _value_at(loaded, section_key)
    cls = getattr(trl, section.trl_config)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    key = f"{section_key}.trl.{name}"
    if name not in fields:
        raise ParamsError(f"{key}: not a field of trl.{section.trl_config}{close_matches(name, list(fields))}")
    field = fields[name]
    owned = section.trl_owned().get(name)
    default = field.default if field.default is not dataclasses.MISSING else (
        field.default_factory() if field.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    grid.add_row("key", f"[cyan]{key}[/]")
    grid.add_row("accepts", escape(type_name(trl_field_types(cls)[name])))
    if owned is not None:
        parent = section_key.rsplit(".", 1)[0] if "." in section_key else ""
        grid.add_row("value", escape(f"set by coevo: use {owned.format(self=section_key, parent=parent)}"))
    elif name in section.trl:
        grid.add_row("value", escape(value_text(section.trl[name])))
    else:
        grid.add_row("value", escape(f"not set (TRL's default: {value_text(default)})"))
    grid.add_row("what it does", escape(" ".join(str(field.metadata.get("help", "")).split())))
    console.print(grid, highlight=False)


@app.command()
def show(
    key: Optional[str] = typer.Argument(None, help="Print only this section or knob (dotted key)."),
    params: Optional[list[Path]] = typer.Option(None, "--params", "-p", help=PARAMS_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Print the merged, validated params as YAML (what a run would use); redirect it to save a params file."""
    with user_errors():
        import yaml
        from pydantic import BaseModel

        from coevo.config import ParamsError, close_matches, field_at, walk

        loaded = _load(params, set_)
        value: Any = loaded
        if key is not None:
            if field_at(key) is None:
                raise ParamsError(f"unknown key {key!r}{close_matches(key, [k for k, _ in walk()])}")
            value = _value_at(loaded, key)
        data = value.model_dump() if isinstance(value, BaseModel) else {key: value}
        typer.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100).rstrip())
