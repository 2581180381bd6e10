"""Atomic artifact writes: a crash or Ctrl-C never leaves a half-written file behind.

Every artifact is written to a temporary name in the destination folder and renamed into
place (rename is atomic on POSIX within one file system).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success rename it onto ``dest``.

    On any exception the temporary file or folder is removed and ``dest`` is untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
        os.chmod(tmp, 0o777 & ~_UMASK)
    else:
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        tmp = Path(name)
        # mkstemp creates 0600; artifacts get the usual umask-based mode instead.
        os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        yield tmp
        if is_dir:
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
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_text(dest: str | os.PathLike, text: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)


def write_json(dest: str | os.PathLike, obj: Any, *, indent: int = 2) -> Path:
    return write_text(dest, json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False) + "\n")


def write_parquet(dest: str | os.PathLike, frame) -> Path:
    """Write a pandas DataFrame to parquet atomically."""
    with atomic_path(dest) as tmp:
        frame.to_parquet(tmp, index=False)
    return Path(dest)


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
