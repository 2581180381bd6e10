"""Download public source files into a size-checked cache (no checksums are published for them).

A file is fetched to a temporary name beside its destination (coevo.io.atomic_path) with a
rich progress bar, its byte count checked against the server's Content-Length, then renamed.
``<cache>/.sizes.json`` records each file's expected size; a cached file whose size differs
(a truncated copy, a file replaced by hand) is fetched again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coevo import io

SIZES_FILE = ".sizes.json"
CHUNK = 1 << 16


class DownloadError(OSError):
    """A download failed or came back short; the message names the URL."""


def _sizes(cache: Path) -> dict[str, int]:
    path = cache / SIZES_FILE
    if not path.exists():
        return {}
    data = io.read_json(path)
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def cached_ok(cache: Path, name: str) -> bool:
    """True when ``cache/name`` exists with the size recorded when it was downloaded."""
    path = cache / name
    expected = _sizes(cache).get(name)
    return path.is_file() and expected is not None and path.stat().st_size == expected


def fetch(url: str, dest: Path, *, session: Any = None, timeout: float = 60.0) -> int:
    """Download ``url`` to ``dest`` atomically; return its size. Raises on HTTP errors or a short read."""
    import requests
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    http = session or requests.Session()
    try:
        response = http.get(url, stream=True, timeout=timeout)
    except requests.RequestException as exc:
        raise DownloadError(f"{url}: download failed ({exc})") from None
    with response:
        if response.status_code != 200:
            raise DownloadError(f"{url}: download failed (HTTP {response.status_code})")
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        written = 0
        with io.atomic_path(dest) as tmp, tmp.open("wb") as out, Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            transient=True,
        ) as progress:
            task = progress.add_task(dest.name, total=expected)
            try:
                for chunk in response.iter_content(chunk_size=CHUNK):
                    if chunk:
                        out.write(chunk)
                        written += len(chunk)
                        progress.update(task, advance=len(chunk))
            except requests.RequestException as exc:
                raise DownloadError(f"{url}: download interrupted after {written} bytes ({exc})") from None
            out.flush()
            if expected is not None and written != expected:
                raise DownloadError(f"{url}: download incomplete: got {written} of {expected} bytes")
            if written == 0:
                raise DownloadError(f"{url}: server returned an empty file")
    return written


def download_files(base_url: str, names: Sequence[str], cache: Path, *, session: Any = None, force: bool = False) -> Path:
    """Fetch ``base_url/<name>`` for each name into ``cache`` unless a size-checked copy is there."""
    cache.mkdir(parents=True, exist_ok=True)
    for name in names:
        if not force and cached_ok(cache, name):
            continue
        size = fetch(f"{base_url.rstrip('/')}/{name}", cache / name, session=session)
        sizes = _sizes(cache)
        sizes[name] = size
        io.write_json(cache / SIZES_FILE, sizes)
    return cache
