"""Artifact I/O: atomic writes, strict reads, JSON-safe values.

Writes: a crash or Ctrl-C never leaves a half-written file behind. Every artifact is
written to a temporary name in the destination folder and renamed into place (rename is
atomic on POSIX within one file system).

Reads: every error names the file (and the line where there is one): a missing file, a
folder where a file was expected, bytes that are not UTF-8, an empty file, invalid JSON.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from coevo import distributed

_UMASK = os.umask(0)
os.umask(_UMASK)


_open_temps = threading.local()  # the temporary folders of this thread's open atomic_path blocks


def _inside_open_temp(dest: Path) -> bool:
    """Whether ``dest`` lies in a temporary folder this thread is filling (a write nobody else makes)."""
    return any(dest.is_relative_to(folder) for folder in getattr(_open_temps, "folders", ()))


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, *, is_dir: bool = False, collective: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success rename it onto ``dest``.

    On any exception the temporary file or folder is removed and ``dest`` is untouched.
    Under a multi-process launch a write is rank 0's: the other ranks drop their copy, and
    all ranks meet at a barrier before going on (``coevo.distributed``). A write into the
    temporary folder of an open ``atomic_path(is_dir=True)`` block is that rank's own, a plain
    write; so is ``collective=False``, a write of this process alone (rank 0's run lock).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    private = not collective or _inside_open_temp(Path(os.path.abspath(dest)))
    commit = private or distributed.is_writer()
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
        os.chmod(tmp, 0o777 & ~_UMASK)
    else:
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        tmp = Path(name)
        # mkstemp creates 0600; artifacts get the usual umask-based mode instead.
        os.chmod(tmp, 0o666 & ~_UMASK)
    open_folders = _open_temps.__dict__.setdefault("folders", [])
    if is_dir:
        open_folders.append(Path(os.path.abspath(tmp)))
    try:
        yield tmp
        if not commit:
            _remove(tmp)
        elif is_dir:
            if dest.exists():
                # Move the old folder aside first so the swap leaves no mixed contents.
                old = dest.with_name(f".{dest.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                dest.rename(old)
                tmp.rename(dest)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(dest)
        else:
            os.replace(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise
    finally:
        if is_dir:
            open_folders.pop()
    if not private:
        distributed.barrier()


def _remove(tmp: Path) -> None:
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def write_text(dest: str | os.PathLike, text: str, *, collective: bool = True) -> Path:
    with atomic_path(dest, collective=collective) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)


def write_json(dest: str | os.PathLike, obj: Any, *, indent: int = 2, collective: bool = True) -> Path:
    return write_text(dest, json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False) + "\n",
                      collective=collective)


def write_parquet(dest: str | os.PathLike, frame) -> Path:
    """Write a pandas DataFrame to parquet atomically."""
    with atomic_path(dest) as tmp:
        frame.to_parquet(tmp, index=False)
    return Path(dest)


def require_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` as a Path; FileNotFoundError / ValueError naming it when it is absent or a folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: {what} does not exist")
    if not path.is_file():
        raise ValueError(f"{path}: expected a {what}, found a folder")
    return path


def read_text(path: str | os.PathLike) -> str:
    """The file decoded as UTF-8 (a BOM is dropped); non-UTF-8 bytes and empty files are errors."""
    path = require_file(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{path}: line {line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "re-encode the file as UTF-8"
        ) from None
    if not text.strip():
        raise ValueError(f"{path}: file is empty")
    return text


def read_json(path: str | os.PathLike) -> Any:
    """The parsed JSON document; errors name the file (and line and column for invalid JSON)."""
    path = Path(path)
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: line {exc.lineno}, column {exc.colno}: invalid JSON ({exc.msg})") from None


def jsonable(value: Any) -> Any:
    """``value`` made of JSON types only, so ``write_json`` can write it and any reader parse it.

    Mappings become dicts with str keys; lists, tuples and sets become lists (sets sorted, so
    the output is stable); numpy and torch scalars and arrays become Python numbers and
    lists; NaN and +-inf become None (strict JSON has no such numbers); anything else that
    is not a str, int, float, bool or None becomes its ``str()``.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return [jsonable(v) for v in sorted(value, key=repr)]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if type(value).__module__.partition(".")[0] in ("numpy", "torch") and hasattr(value, "tolist"):
        value = value.tolist()  # numpy scalars and arrays, torch tensors: Python numbers and lists
        if isinstance(value, list):
            return jsonable(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return str(value)
