"""`mlflow models serve -m models:/coevo-cogr-toy@champion --env-manager local`: the real
scoring server on 127.0.0.1 (a free port) answers POST /invocations with what in-process
`predict` returns; malformed requests get a 400 with a clear message and the server keeps
serving; the server and its children are stopped at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from coevo.serving import registry
from tests.test_search import DATASET, QUERIES, trained

pytestmark = pytest.mark.slow

NAME = registry.model_name("cogr", DATASET)
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes | str, content_type: str = "application/json", timeout: float = 120) -> tuple[int, dict]:
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        try:
            return error.code, json.loads(text)
        except json.JSONDecodeError:
            return error.code, {"message": text}


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    """A tiny CoGR retriever logged, registered and made champion in a sqlite store."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from coevo.serving.pyfunc import log_retriever, tracking_uri
    from coevo.serving.search import from_run

    run = trained(tmp_path_factory, "cogr")
    folder = tmp_path_factory.mktemp("serve_store")
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri, registry_uri=uri)
    experiment = client.create_experiment("cogr", artifact_location=(folder / "mlruns").as_uri())
    retriever = from_run("cogr", run.run_dir, run.params, run.data_dir)
    with tracking_uri(uri):
        with mlflow.start_run(experiment_id=experiment) as mlrun:
            info = log_retriever(retriever)
        version = registry.register_version(client, NAME, source=info.model_uri, run_id=mlrun.info.run_id,
                                            model_id=info.model_id)
    registry.promote(client, NAME, metric="f1")
    assert registry.aliases(client, NAME) == {"challenger": version, "champion": version}
    return {"uri": uri, "folder": folder, "run_id": mlrun.info.run_id}


@pytest.fixture(scope="module")
def server(champion):
    """`mlflow models serve` in a session of its own; stopped (the whole group) afterwards."""
    port = free_port()
    log = champion["folder"] / "server.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": champion["uri"],
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # uvicorn of this venv
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{NAME}@champion",
               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer /ping within {START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"url": url, "proc": proc, "log": log}
    finally:
        stop_group(proc)
    assert not group_alive(proc.pid), "a process of the server's group survived"


def stop_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace_s
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def records(queries: list[str], k: int | None = None) -> str:
    body: dict = {"dataframe_records": [{"query": q} for q in queries]}
    if k is not None:
        body["params"] = {"k": k}
    return json.dumps(body)


def test_the_served_champion_answers_like_in_process_predict(champion, server):
    import mlflow

    from coevo.serving.pyfunc import tracking_uri

    with tracking_uri(champion["uri"]):
        model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    expected = model.predict(pd.DataFrame({"query": QUERIES}), params={"k": 5}).to_dict(orient="records")
    status, answer = post(f"{server['url']}/invocations", records(QUERIES, k=5))
    assert status == 200, answer
    assert answer["predictions"] == expected
    # the split orientation, and k from the signature's default (10)
    split = json.dumps({"dataframe_split": {"columns": ["query"], "data": [[QUERIES[0]]]}})
    status, answer = post(f"{server['url']}/invocations", split)
    assert status == 200 and answer["predictions"] == model.predict(pd.DataFrame({"query": QUERIES[:1]})) \
        .to_dict(orient="records")


@pytest.mark.parametrize("body,message", [
    (json.dumps({"dataframe_records": [{"text": "no query column"}]}), "query"),
    (records(["a fine query", ""]), "query 1: empty string"),
    (records(["   "]), "query 0: empty string"),
    (records(["q"] * 10_000), "10000 queries in one request; at most 1000"),
    (records(["fine"], k=0), "k must be an integer between 1 and 1000"),
    ("{not json", ""),
], ids=["no-query-column", "empty-string", "blank", "10000-queries", "k-0", "bad-json"])
def test_malformed_requests_get_a_clear_400_and_the_server_keeps_serving(server, body, message):
    status, answer = post(f"{server['url']}/invocations", body)
    assert status == 400, answer
    assert answer.get("error_code") in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST", "MALFORMED_REQUEST"), answer
    assert message in answer.get("message", ""), answer
    assert server["proc"].poll() is None
    status, answer = post(f"{server['url']}/invocations", records(QUERIES[:1], k=2))
    assert status == 200 and len(answer["predictions"]) == 1
