"""Checks that run before any work: can the tracking store be used?"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse


class TrackingError(RuntimeError):
    """The tracking store cannot be used (unreachable server, unwritable folder)."""


def check_reachable(uri: str, timeout_s: float = 3.0) -> None:
    """Fail fast, before any work, when the tracking store cannot be reached.

    Remote (http/https) URIs get a TCP connect and a `GET /health` with a short timeout;
    local ones (sqlite, file, a plain path) must have a writable parent folder.
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
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

        try:
            requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
        except requests.RequestException as exc:
            raise TrackingError(f"tracking.uri {uri!r} does not answer HTTP within {timeout_s:.0f}s: {exc}") from None
        return
    if scheme == "sqlite":
        db = Path(uri.split("///", 1)[1]) if "///" in uri else None
        folder = (db.parent if db else Path(".")).resolve()
    elif scheme in ("", "file"):
        folder = Path(parsed.path if scheme == "file" else uri).resolve()
        folder = folder if folder.is_dir() else folder.parent
    else:
        return  # databricks, postgresql, ...: MLflow's own client reports those
    if not folder.exists() or not os.access(folder, os.W_OK):
        raise TrackingError(f"tracking.uri {uri!r}: folder {folder} does not exist or is not writable")
