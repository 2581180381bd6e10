"""Screenshot of the MLflow UI as a user meets it, and a check of what the page shows (not CI).

    .venv/bin/python bench/mlflow_screenshot.py [--experiment cogr] [--runs 4]
        [--view compare|charts|tables|runs|run|run-metrics|models] [--model NAME] [--search TEXT] [--expect TEXT ...]
        [--tracking-uri sqlite:///mlflow.db] [--out docs/mlflow_<view>.png]

It starts `mlflow ui` on a free port of 127.0.0.1 over the tracking store (default: the
`tracking.uri` of params.yaml), picks the experiment's latest runs, opens the run-comparison
page (`#/compare-runs?runs=[...]&experiments=[...]`; `--view charts`: the experiment's runs
side by side, one bar chart per metric, `--search summary/` keeping the summary metrics;
`--view tables`: the runs' logged tables side by side (the runs page's table comparison);
`--view runs`: the experiment's run list; `--view run`: the latest run's page, `run-metrics` its Model metrics tab; `--view models`: the registered model's page, of
`--model` or of the latest run) in headless Chromium (Debian's `chromium` package:
`apt-get install -y chromium`), saves a PNG and stops both. Each `--expect TEXT` must appear
in the page's visible text (`document.body.innerText`) before `--wait-ms` ends; a missing one
is named and the script exits 1, after saving the PNG, so the check is what a user sees. Chromium is driven over its DevTools protocol (the `websockets`
package MLflow already installs): the UI's local settings are set as a user would leave them
(the sidebar on "Model training", the assistant panel closed), the page gets `--wait-ms` to
render its tables and charts, then the viewport is captured.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# MLflow 3.17's sidebar switch (GenAI | Model training) decides the view and starts on GenAI in a
# fresh browser; this URL parameter selects Model training (and the UI keeps it while navigating).
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_uri() -> str:
    import yaml

    uri = yaml.safe_load((REPO / "params.yaml").read_text())["tracking"]["uri"]
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str((REPO / uri[len("sqlite:///"):]).resolve())
    return uri


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("no Chromium: install Debian's package (apt-get install -y chromium)")


def start_ui(uri: str, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"mlflow ui exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    stop(proc)
    sys.exit(f"mlflow ui did not start: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def page(uri: str, experiment: str, runs: int, view: str, model: str | None = None) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        sys.exit(f"{uri}: no experiment {experiment!r} (run `coevo run {experiment}` first)")
    latest = client.search_runs([found.experiment_id], order_by=["attributes.start_time DESC"], max_results=runs)
    if view in ("run", "run-metrics") and latest:
        tab = "/model-metrics" if view == "run-metrics" else ""
        return f"#/experiments/{found.experiment_id}/runs/{latest[0].info.run_id}{tab}?{MODEL_TRAINING_VIEW}"
    if view == "models":
        return f"#/models/{urllib.parse.quote(model or registered_model(client, latest), safe='')}"
    if view == "charts":  # the runs side by side, a chart per metric
        return f"#/experiments/{found.experiment_id}/runs?compareRunsMode=CHART&{MODEL_TRAINING_VIEW}"
    if view == "tables":  # the runs' logged tables (mlflow.log_table) side by side, a column per run
        return f"#/experiments/{found.experiment_id}/runs?compareRunsMode=ARTIFACT&{MODEL_TRAINING_VIEW}"
    if view == "runs" or len(latest) < 2:
        return f"#/experiments/{found.experiment_id}?{MODEL_TRAINING_VIEW}"
    ids = [r.info.run_id for r in latest]
    query = urllib.parse.quote(json.dumps(ids), safe="") + "&experiments=" + \
        urllib.parse.quote(json.dumps([found.experiment_id]), safe="")
    return f"#/compare-runs?runs={query}&{MODEL_TRAINING_VIEW}"


def registered_model(client, runs) -> str:
    """The registered model a version of which came from one of ``runs`` (newest run first)."""
    for run in runs:
        versions = client.search_model_versions(f"run_id = '{run.info.run_id}'")
        if versions:
            return versions[0].name
    sys.exit("no registered model comes from the experiment's latest runs; pass --model NAME")


# What a user who closed the assistant and chose "Model training" has in localStorage (MLflow
# 3.17 stores `<key>_v<version>` = JSON).
UI_SETTINGS = {"mlflow.workflowType_v1": "machine_learning", "mlflow.assistant.panelOpen_v1": False,
               "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True}


CHART_SEARCH = 'input[placeholder="Search metric charts"]'


async def capture(browser: str, origin: str, fragment: str, out: Path, size: str, wait_ms: int, profile: str,
                  expect: list[str] = (), search: str | None = None) -> list[str]:
    """Open ``origin/fragment`` in headless Chromium with UI_SETTINGS, wait, save a PNG; return
    the ``expect`` texts the page did not show within ``wait_ms`` (it stops waiting once all show).
    ``search`` is typed into the charts' search box, as a user narrows the charts to a few."""
    import websockets

    port = free_port()
    width, height = (int(v) for v in size.split(","))
    proc = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
                             f"--window-size={width},{height}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as response:
                    pages = [t for t in json.loads(response.read()) if t.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.exit("Chromium did not open its DevTools port")
            await asyncio.sleep(0.3)
        async with websockets.connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as ws:
            counter = 0

            async def call(method: str, **params):
                nonlocal counter
                counter += 1
                await ws.send(json.dumps({"id": counter, "method": method, "params": params}))
                while True:
                    message = json.loads(await ws.recv())
                    if message.get("id") == counter:
                        if "error" in message:
                            raise RuntimeError(f"{method}: {message['error']}")
                        return message.get("result", {})

            await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                       mobile=False)
            await call("Page.navigate", url=f"{origin}/")
            await asyncio.sleep(2)
            script = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(json.dumps(v))});"
                             for k, v in UI_SETTINGS.items())
            await call("Runtime.evaluate", expression=script)
            # A hash change keeps the app as it started (and may not have applied before a reload):
            # leave the page, then load the app afresh at the fragment, with the settings.
            await call("Page.navigate", url="about:blank")
            await asyncio.sleep(0.5)
            await call("Page.navigate", url=f"{origin}/{fragment}")
            deadline = time.monotonic() + wait_ms / 1000
            if search:
                while True:
                    found = await call("Runtime.evaluate", returnByValue=True, expression=(
                        f"(() => {{ const box = document.querySelector({json.dumps(CHART_SEARCH)});"
                        " if (box) box.focus(); return !!box; })()"))
                    if found.get("result", {}).get("value"):
                        await call("Input.insertText", text=search)
                        break
                    if time.monotonic() > deadline:
                        sys.exit("the page has no chart search box (--search works with --view charts)")
                    await asyncio.sleep(0.5)
            missing = list(expect)
            while True:
                await asyncio.sleep(0.5)
                if expect:
                    shown = await call("Runtime.evaluate", expression="document.body.innerText", returnByValue=True)
                    text = shown.get("result", {}).get("value") or ""
                    missing = [e for e in expect if e not in text]
                    if not missing:
                        await asyncio.sleep(1)  # the text is there: let charts finish drawing for the PNG
                        break
                if time.monotonic() > deadline:
                    break
            shot = await call("Page.captureScreenshot", format="png")
            out.write_bytes(base64.b64decode(shot["data"]))
            return missing
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None, help="MLflow store (default: tracking.uri of params.yaml)")
    parser.add_argument("--experiment", default="cogr")
    parser.add_argument("--runs", type=int, default=4, help="latest runs to compare")
    parser.add_argument("--view", choices=("compare", "charts", "tables", "runs", "run", "run-metrics", "models"), default="compare")
    parser.add_argument("--model", help="registered model for --view models (default: the latest run's)")
    parser.add_argument("--search", help="with --view charts: text typed into the charts' search box (e.g. summary/)")
    parser.add_argument("--expect", action="append", default=[], help="text the page must show (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: docs/mlflow_<view>.png)")
    parser.add_argument("--size", default="1600,1000", help="viewport, WIDTH,HEIGHT")
    parser.add_argument("--wait-ms", type=int, default=8000, help="time for the page to render")
    args = parser.parse_args()
    uri = args.tracking_uri or default_uri()
    args.out = args.out or REPO / "docs" / f"mlflow_{args.view.replace('-', '_')}.png"
    browser = chromium()
    fragment = page(uri, args.experiment, args.runs, args.view, args.model)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="coevo-shot-") as tmp:
        proc = start_ui(uri, port, Path(tmp) / "ui.log")
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            missing = asyncio.run(capture(browser, f"http://127.0.0.1:{port}", fragment, args.out.resolve(),
                                          args.size, args.wait_ms, f"{tmp}/profile", args.expect, args.search))
        finally:
            stop(proc)
    print(f"http://127.0.0.1:{port}/{fragment}")
    if args.expect:
        print("shows: " + ", ".join(repr(e) for e in args.expect if e not in missing))
    if missing:
        print(f"saved {args.out}")
        sys.exit("the page does not show: " + ", ".join(repr(e) for e in missing))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
