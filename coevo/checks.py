"""Checks that run before any work, and guards that stop a phase from finishing on bad output.

- :func:`check_reachable`: the tracking store can be used: a scheme MLflow supports, a
  server that answers *and speaks MLflow*, or a writable local folder;
- :func:`check_writable`: an output folder (or the folder a file goes to) can be written;
- :func:`check_generation_yield`: a generator that wrote nothing usable for too many inputs
  fails its phase with examples, instead of finishing it with empty outputs;
- :func:`check_safetensors`: a checkpoint file is a complete safetensors file (names it).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
from collections.abc import Mapping, Sequence, Sized
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


class TrackingError(RuntimeError):
    """The tracking store cannot be used (unreachable server, unwritable folder)."""


class GenerationError(ValueError):
    """A generator produced nothing usable for too many inputs."""


# MLflow's tracking store registry (mlflow.tracking._tracking_service.utils) plus SQLAlchemy
# dialect+driver forms (postgresql+psycopg2://).
MLFLOW_SCHEMES = frozenset({"", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks",
                            "databricks-uc", "uc"})
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _http_check(uri: str, timeout_s: float) -> None:
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    host = parsed.hostname
    port = parsed.port or (443 if scheme == "https" else 80)
    if not host:
        raise TrackingError(f"tracking.uri {uri!r}: no host name")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise TrackingError(
            f"tracking.uri {uri!r} is unreachable ({host}:{port}: {exc.strerror or exc}); "
            "start the server (`mlflow server ...`) or set tracking.uri to sqlite:///mlflow.db"
        ) from None
    import requests

    probe = uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name"
    try:
        response = requests.get(probe, params={"experiment_name": "Default"}, timeout=timeout_s)
    except requests.RequestException as exc:
        raise TrackingError(f"tracking.uri {uri!r} does not answer HTTP within {timeout_s:.0f}s: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        body = None
    # MLflow answers JSON: {"experiment": ...}, or {"error_code": ...} (missing, unauthorised).
    if not (isinstance(body, dict) and ("experiment" in body or "error_code" in body)):
        raise TrackingError(
            f"tracking.uri {uri!r} answers HTTP but does not speak MLflow (GET {probe} gave status "
            f"{response.status_code}, {response.headers.get('content-type', 'no content type')}); point tracking.uri "
            "at an MLflow tracking server, or use sqlite:///mlflow.db"
        )


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for an in-memory database)."""
    rest = uri.split(":", 1)[1]
    if not rest.startswith("///"):
        return None
    path = rest[3:].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def check_reachable(uri: str, timeout_s: float = 3.0) -> None:
    """Fail fast, before any work, when the tracking store cannot be used.

    The scheme must be one MLflow supports (``ftp://`` is refused at once). Remote (http/https)
    URIs get a TCP connect and a request MLflow answers with JSON, with a short timeout, so a
    web server that is not MLflow is refused too; local ones (sqlite, file, a plain path) must
    have a writable folder, and an existing sqlite file must be a SQLite database.
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if len(scheme) == 1 and os.name == "nt":  # a Windows drive letter
        scheme = ""
    if scheme.split("+", 1)[0] not in MLFLOW_SCHEMES:
        raise TrackingError(
            f"tracking.uri {uri!r}: scheme {scheme!r} is not a tracking store MLflow supports; use sqlite:///mlflow.db, "
            "a folder, http(s)://<mlflow server>, or a database URI (postgresql://, mysql://, mssql://)"
        )
    if scheme in ("http", "https"):
        _http_check(uri, timeout_s)
        return
    if scheme == "sqlite":
        db = sqlite_file(uri)
        folder = (db.parent if db else Path(".")).resolve()
        if db is not None and db.is_dir():
            raise TrackingError(f"tracking.uri {uri!r}: {db} is a folder, expected an SQLite database file")
        if db is not None and db.is_file() and db.stat().st_size:
            with db.open("rb") as f:
                if f.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                    raise TrackingError(f"tracking.uri {uri!r}: {db} is not an SQLite database")
    elif scheme in ("", "file"):
        folder = Path(parsed.path if scheme == "file" else uri).resolve()
        folder = folder if folder.is_dir() else folder.parent
    else:
        return  # databricks, postgresql, ...: MLflow's own client reports those
    if not folder.exists() or not os.access(folder, os.W_OK):
        raise TrackingError(f"tracking.uri {uri!r}: folder {folder} does not exist or is not writable")


def check_writable(path: str | Path, what: str) -> Path:
    """The folder ``path`` (existing or to be created) can be written; ValueError naming ``what``.

    The nearest existing ancestor must be a writable folder (a file in the way, a read-only
    mount or missing permissions fail here, before any work); an existing folder is probed
    with a temporary file, since permission bits do not show a read-only mount everywhere.
    """
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{what} {path}: {probe} is a file, a folder was expected")
    try:
        fd, name = tempfile.mkstemp(prefix=".coevo-write-check-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot write in {probe} ({exc.strerror or exc})") from None
    return path


def check_generation_yield(
    outputs: Mapping[str, Sized | None] | Sequence[Sized | None],
    share: float,
    what: str,
    examples: Mapping[str, str] | Sequence[str] | None = None,
    knob: str = "",
    shown: int = 3,
) -> float:
    """Fail when more than ``share`` of the inputs got no usable output; return the empty share.

    ``outputs``: per input (by id, or in order), what the generator produced after parsing
    (a keyword set, a text); None or an empty one counts as nothing. ``examples``: the raw
    generated text per input, shown (up to ``shown``) in the error. ``what``: the phase and
    the side, e.g. ``"phase 00_sft, item generator"``; ``knob``: the setting that allows more.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"check_generation_yield: share must be in [0, 1], got {share}")
    keyed = dict(outputs) if isinstance(outputs, Mapping) else {str(i): o for i, o in enumerate(outputs)}
    if not keyed:
        return 0.0
    empty = [k for k, v in keyed.items() if v is None or len(v) == 0]
    fraction = len(empty) / len(keyed)
    if fraction > share:
        raw = dict(examples) if isinstance(examples, Mapping) else (
            {str(i): t for i, t in enumerate(examples)} if examples is not None else {})
        samples = "; ".join(f"{k}: {json.dumps(raw.get(k, ''))[:120]}" for k in empty[:shown])
        allowed = f" ({knob} = {share:g})" if knob else f" (allowed: {share:.0%})"
        raise GenerationError(
            f"{what}: no usable output for {len(empty)} of {len(keyed)} inputs ({fraction:.0%}, more than allowed"
            f"{allowed}); e.g. {samples or ', '.join(empty[:shown])}. The model may have diverged (a learning rate "
            "too high) or the prompt/parsing does not fit the generator."
        )
    return fraction


def check_safetensors(path: str | Path) -> Path:
    """``path`` is a complete safetensors file (header length, JSON header, data size); ValueError naming it."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: corrupt safetensors checkpoint (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(f"{path}: corrupt or truncated safetensors checkpoint (invalid header length {n}, "
                             f"file is {size} bytes)")
        try:
            header: dict[str, Any] = json.loads(f.read(n))
        except ValueError:
            raise ValueError(f"{path}: corrupt safetensors checkpoint (its header is not JSON)") from None
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise ValueError(f"{path}: truncated safetensors checkpoint ({size} bytes, its header needs {8 + n + end})")
    return path
