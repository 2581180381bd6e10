"""The one staleness rule: a step re-runs if and only if its inputs changed.

A step (a data step, a method phase, an evaluation step) has a *key*: the md5 of its name,
the params subtree it depends on, the fingerprints of what it reads (the data set, the keys
of the phases it reads) and the library code it runs (its syntax, so an edit of a comment, a
docstring or the layout re-runs nothing: :func:`code_hash`). When a step finishes,
its result is stored with its key in a *stamp* file, with each output's DVC md5 and the size
of every file in it; the step is done while the stamp's key equals the key computed now and its
outputs are still what was written (sizes on every check, md5s once per process and whenever
a file's size or mtime changed). An output that no longer matches is named in a one-line
notice and its step runs again.

Everything that decides whether work is redone calls these functions: the library's resume
check (``coevo train``), the Prefect cache key of every task (``coevo run``), and the
pre-flight check that lets a finished pipeline answer without starting Prefect. ``dvc.yaml``
is generated from the same declarations (``coevo.dvc``), so DVC agrees.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from coevo import distributed, progress
from coevo.io import read_json, write_json

ABSENT = "absent"


def fingerprint(path: str | Path) -> str:
    """DVC's md5 of a file or folder (``<md5>`` or ``<md5>.dir``), or "absent".

    Computed with dvc-data (DVC's hashing library), so the value equals what ``dvc.lock``
    records for the same path and can serve as a key input and as an MLflow tag.
    """
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem
    from dvc_objects.fs.memory import MemoryFileSystem

    path = Path(path)
    if not path.exists():
        return ABSENT
    staging = HashFileDB(MemoryFileSystem(), "/fingerprint")
    _, _, obj = build(staging, str(path.resolve()), LocalFileSystem(), "md5", dry_run=True)
    return str(obj.hash_info.value)


def module_files(module: str) -> list[Path]:
    """The source files of a module or package (all ``*.py`` below a package)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"code dependency {module!r} does not exist")
    origin = Path(spec.origin)
    return sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]


def module_path(module: str) -> str:
    """A module as a path relative to the project root (``coevo/models``, ``coevo/io.py``): DVC deps."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"code dependency {module!r} does not exist")
    origin = Path(spec.origin)
    parts = module.split(".")
    return "/".join(parts) if origin.name == "__init__.py" else "/".join(parts) + ".py"


@functools.lru_cache(maxsize=64)
def code_hash(modules: tuple[str, ...]) -> str:
    """md5 over the code of the named modules/packages (sorted, path-qualified): each file's
    syntax tree without its docstrings and type hints (:func:`code_of`), so only an edit of what
    runs changes it."""
    digest = hashlib.md5()
    for name in sorted(set(modules)):
        files = module_files(name)
        base = Path(importlib.util.find_spec(name).origin).parent
        for file in files:
            digest.update(f"{name}:{file.relative_to(base)}".encode())
            stat = file.stat()
            digest.update(_code_digest(str(file), stat.st_mtime_ns, stat.st_size))
    return digest.hexdigest()


@functools.lru_cache(maxsize=1024)
def _code_digest(path: str, mtime_ns: int, size: int) -> bytes:
    """md5 of one file's :func:`code_of`, parsed once per process while the file is unchanged
    (the module lists of the steps share most files)."""
    return hashlib.md5(code_of(Path(path).read_bytes())).digest()


def code_of(source: bytes) -> bytes:
    """What a source file contributes to a code key: its syntax tree (``ast.dump``: comments and
    layout are not in it) without what never runs (:class:`_TypeOnly`): docstrings, the parameter
    and return annotations of functions (the project's modules use ``from __future__ import
    annotations``), ``if TYPE_CHECKING:`` blocks and ``typing`` imports (each runtime use of a
    typing name is in the tree itself). Annotated assignments stay: a pydantic or dataclass field's
    annotation is behaviour. So a docstring or a type hint can be fixed without re-training. A file
    that does not parse counts by its bytes. The tree's form is Python's own, so keys are per
    Python minor version (the project pins 3.11)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    return ast.dump(_TypeOnly().visit(tree)).encode()


class _TypeOnly(ast.NodeTransformer):
    """Drops the parts of a syntax tree that never run (see :func:`code_of`)."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
        return super().generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.returns = None
        signature = node.args
        for arg in (*signature.posonlyargs, *signature.args, *signature.kwonlyargs, signature.vararg, signature.kwarg):
            if arg is not None:
                arg.annotation = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            kept: list[ast.stmt] = []
            for statement in node.orelse:
                visited = self.visit(statement)
                kept.extend(visited if isinstance(visited, list) else [visited] if visited else [])
            return kept
        return self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        return None if node.module == "typing" and not node.level else node

    def visit_Import(self, node: ast.Import) -> ast.AST | None:
        node.names = [alias for alias in node.names if alias.name != "typing"]
        return node if node.names else None


def select(tree: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The values of dotted ``keys`` (``cogr.sft``, ``seed``) in a nested params dump."""
    out = {}
    for key in keys:
        node: Any = tree
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out


def step_key(step: str, params: Mapping[str, Any], inputs: Sequence[str], code: str) -> str:
    """The key of one step: what it is, the params it reads, what it reads, the code it runs."""
    payload = {"step": step, "params": params, "inputs": list(inputs), "code": code}
    return hashlib.md5(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------------------------- stamps
def read_stamp(path: Path) -> dict[str, Any] | None:
    return read_json(path) if path.exists() else None


def _files(path: Path) -> list[tuple[str, int, int]]:
    """(relative name, size, mtime_ns) of a file, or of every file below a folder."""
    if not path.is_dir():
        info = path.stat()
        return [("", info.st_size, info.st_mtime_ns)]
    stats = ((f, f.stat()) for f in path.rglob("*") if f.is_file())
    return sorted((str(f.relative_to(path)), info.st_size, info.st_mtime_ns) for f, info in stats)


def output_record(outputs: Iterable[Path]) -> list[dict[str, Any]]:
    """What a stamp records of each output: its DVC md5 (as ``dvc.lock`` would) and each file's size."""
    return [{"path": Path(path).name, "md5": fingerprint(path),
             "sizes": {name: size for name, size, _ in _files(Path(path))}} for path in outputs]


# md5s verified in this process: first output -> (key, the (name, size, mtime_ns) listings checked)
_verified: dict[str, tuple] = {}


def output_change(stamp: Mapping[str, Any], outputs: Sequence[Path]) -> str | None:
    """Why a done step's outputs are no longer what it wrote (``<file>: missing``, ``<file>: 64 bytes,
    8,123 when written``, ``<output>: content changed ...``), or None while they are. Sizes are
    compared on every call, md5s once per process and again when a size or mtime moved. Stamps
    written before outputs were recorded are checked for existence only."""
    for path in outputs:
        if not Path(path).exists():
            return f"{path}: missing"
    recorded = stamp.get("outputs")
    if not isinstance(recorded, list) or len(recorded) != len(outputs):
        return None
    listings = []
    for path, entry in zip(outputs, recorded):
        files = _files(Path(path))
        sizes, written = {name: size for name, size, _ in files}, entry.get("sizes", {})
        for name in sorted(set(sizes) | set(written)):
            where = Path(path) / name if name else Path(path)
            if name not in sizes:
                return f"{where}: missing"
            if name not in written:
                return f"{where}: not written by the step"
            if sizes[name] != written[name]:
                return f"{where}: {sizes[name]:,} bytes, {written[name]:,} when written"
        listings.append(tuple(files))
    seen = (stamp.get("key"), tuple(listings))
    if _verified.get(str(outputs[0])) == seen:
        return None
    for path, entry in zip(outputs, recorded):
        if fingerprint(path) != entry.get("md5"):
            return f"{path}: content changed since the step finished (md5 {entry.get('md5')} when written)"
    _verified[str(outputs[0])] = seen
    return None


def is_done(stamp_path: Path, key: str, outputs: Iterable[Path] = ()) -> bool:
    """Finished with this key, and every output is still what the step wrote."""
    stamp = read_stamp(stamp_path)
    return bool(stamp and stamp.get("state") == "done" and stamp.get("key") == key
                and output_change(stamp, list(outputs)) is None)


def remove_outputs(outputs: Iterable[Path]) -> None:
    """Remove a step's outputs (rank 0's job under a multi-process launch: ``coevo.distributed``)."""
    if not distributed.is_writer():
        return
    for path in outputs:
        path = Path(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def run_stamped(stamp_path: Path, key: str, outputs: Sequence[Path], work: Callable[[], dict[str, Any]],
                resumable: bool = False, meta: Mapping[str, Any] | None = None, label: str | None = None,
                verify: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """Run ``work`` unless done with ``key``; store its result with the key and its outputs' record.

    Outputs of an earlier key are removed first. With ``resumable``, partial outputs of an
    interrupted attempt *with the same key* are kept, so the step can continue from them; a
    finished step whose outputs changed afterwards (truncated, edited, partly deleted) is
    redone from scratch, with a notice naming the step (``label``, else the stamp's name) and
    the file. ``verify`` is the step's own check of a finished result (False: run it again).
    """
    stamp = read_stamp(stamp_path)
    same_key = bool(stamp and stamp.get("key") == key)
    if same_key and stamp.get("state") == "done":
        change = output_change(stamp, list(outputs))
        if change is None and (verify is None or verify(stamp["result"])):
            return stamp["result"]
        if change is not None:
            progress.notice(f"{label or stamp_path.stem}: {change}; running it again")
        resumable = False
    if not (resumable and same_key):
        remove_outputs(outputs)
    write_json(stamp_path, {"key": key, "state": "running", **(meta or {})})
    result = work()
    written = output_record(outputs) if outputs else []
    write_json(stamp_path, {"key": key, "state": "done", "result": result, **(meta or {}),
                            **({"outputs": written} if written else {})})
    if written:
        _verified[str(outputs[0])] = (key, tuple(tuple(_files(Path(p))) for p in outputs))
    return result
