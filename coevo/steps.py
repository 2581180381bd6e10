"""The one staleness rule: a step re-runs if and only if its inputs changed.

A step (a data step, a method phase, an evaluation step) has a *key*: the md5 of its name,
the params subtree it depends on, the fingerprints of what it reads (the data set, the keys
of the phases it reads) and the source of the library code it runs. When a step finishes,
its result is stored with its key in a *stamp* file; the step is done while the stamp's key
equals the key computed now and its outputs exist.

Everything that decides whether work is redone calls these functions: the library's resume
check (``coevo train``), the Prefect cache key of every task (``coevo run``), and the
pre-flight check that lets a finished pipeline answer without starting Prefect. ``dvc.yaml``
is generated from the same declarations (``coevo.dvc``), so DVC agrees.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from coevo import distributed
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
    """md5 over the source of the named modules/packages (sorted, path-qualified)."""
    digest = hashlib.md5()
    for name in sorted(set(modules)):
        files = module_files(name)
        base = Path(importlib.util.find_spec(name).origin).parent
        for file in files:
            digest.update(f"{name}:{file.relative_to(base)}".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


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


def is_done(stamp_path: Path, key: str, outputs: Iterable[Path] = ()) -> bool:
    """Finished with this key, and every output is still there."""
    stamp = read_stamp(stamp_path)
    return bool(stamp and stamp.get("state") == "done" and stamp.get("key") == key
                and all(Path(p).exists() for p in outputs))


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
                resumable: bool = False, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run ``work`` unless done with ``key``; store its result with the key.

    Outputs of an earlier key are removed first. With ``resumable``, partial outputs of an
    interrupted attempt *with the same key* are kept, so the step can continue from them.
    """
    stamp = read_stamp(stamp_path)
    if stamp and stamp.get("key") == key and stamp.get("state") == "done" and all(Path(p).exists() for p in outputs):
        return stamp["result"]
    if not (resumable and stamp and stamp.get("key") == key):
        remove_outputs(outputs)
    write_json(stamp_path, {"key": key, "state": "running", **(meta or {})})
    result = work()
    write_json(stamp_path, {"key": key, "state": "done", "result": result, **(meta or {})})
    return result
