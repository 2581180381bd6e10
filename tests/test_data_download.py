"""WANDS download path against a local HTTP server (no internet here): progress, size-checked cache, errors."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator

import pytest

from coevo.data.download import SIZES_FILE, DownloadError, cached_ok, download_files, fetch
from coevo.data.loaders import WANDS_FILES, load_source
from tests.conftest import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "wands"


class Handler(http.server.SimpleHTTPRequestHandler):
    requests_seen: list[str] = []
    short: set[str] = set()  # paths served with a Content-Length larger than the body

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        type(self).requests_seen.append(self.path)
        name = self.path.rsplit("/", 1)[-1]
        if name in self.short:
            body = (FIXTURE / name).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body) + 100))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.requests_seen = []
    Handler.short = set()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(FIXTURE)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_download_then_load_then_cache_hit(server, tmp_path):
    cache = tmp_path / "wands"
    ds = load_source("wands", cache, download=True, base_url=server)
    assert len(ds.items) == 12 and len(ds.qrels) == 22
    for name in WANDS_FILES:
        assert (cache / name).read_bytes() == (FIXTURE / name).read_bytes()
        assert cached_ok(cache, name)
    assert len(Handler.requests_seen) == 3
    load_source("wands", cache, download=True, base_url=server)
    assert len(Handler.requests_seen) == 3  # size-checked cache hit: nothing fetched again


def test_truncated_cache_file_is_fetched_again(server, tmp_path):
    cache = tmp_path / "wands"
    download_files(server, WANDS_FILES, cache)
    (cache / "label.csv").write_bytes((FIXTURE / "label.csv").read_bytes()[:50])
    assert not cached_ok(cache, "label.csv")
    download_files(server, WANDS_FILES, cache)
    assert Handler.requests_seen[-1].endswith("/label.csv") and len(Handler.requests_seen) == 4
    assert (cache / "label.csv").read_bytes() == (FIXTURE / "label.csv").read_bytes()


def test_short_download_leaves_nothing(server, tmp_path):
    Handler.short = {"product.csv"}
    with pytest.raises(DownloadError, match=r"product\.csv: download (incomplete|interrupted)"):
        fetch(f"{server}/product.csv", tmp_path / "product.csv")
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file


def test_http_error_names_url(server, tmp_path):
    with pytest.raises(DownloadError, match=r"/nope\.csv: download failed \(HTTP 404\)"):
        download_files(server, ["nope.csv"], tmp_path / "c")
    assert not (tmp_path / "c" / "nope.csv").exists() and not (tmp_path / "c" / SIZES_FILE).exists()


def test_unreachable_server(tmp_path):
    with pytest.raises(DownloadError, match="download failed"):
        fetch("http://127.0.0.1:9/product.csv", tmp_path / "product.csv", timeout=2)


def test_default_urls_are_official():
    from coevo.data.loaders import WANDS_BASE_URL

    assert WANDS_BASE_URL == "https://raw.githubusercontent.com/wayfair/WANDS/main/dataset"
