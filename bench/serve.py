"""Serving overhead: a registered retriever served over HTTP (`mlflow models serve --env-manager
local`) next to in-process `predict` of the same model, per method, for the `tiny` and the
`smollm2-135m` generators, on CPU.

    .venv/bin/python bench/serve.py [--requests 30] [--methods cogr,grape,cohyde] [--generators tiny,smollm2-135m]

For each (generator, method): a small run on a MetaTool subset of the committed sample (the
cheapest settings that serve: CoGR without SFT, GRAPE with 3 GRPO steps, CoHyDE without a
round; latency depends on the model and the generation length, not on how long it trained;
generation lengths are params.yaml's), logged and registered as `champion` in a throw-away
sqlite store (training and logging run in a subprocess, so the measuring process only loads
the model); then `--requests` single-query requests, one at a time, to the model loaded in
this process and to the served model, interleaved query by query in alternating order (a
busy minute of a shared machine, or a long generation, falls on both sides alike), after two
warm-up calls each: p50 / p95 latency per query and queries/s; and three batches of 16
queries in one call each (queries/s, median batch).

The last line is `serve_overhead_ratio=<HTTP p50 / in-process p50>` for CoGR with
smollm2-135m (target <= 1.5); when that pair is not measured (`--generators tiny`), the ratio of
the first pair measured, followed by which pair it is.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

SETTINGS = {
    # max_empty_share: an untrained model may write no keywords for most items; latency is what
    # is measured here, so a thin index must not stop the run.
    "cogr": ["cogr.sft_init=false", "cogr.rounds=0", "cogr.max_empty_share=1.0"],
    "grape": ["grape.grpo.steps=3", "grape.eval_every=2", "grape.grpo.batch_size=4", "grape.grpo.num_generations=2"],
    "cohyde": ["cohyde.rounds=0", "cohyde.warmup_max_examples=8", "cohyde.warmup_formats_per_item=1",
               "cohyde.max_train_queries=8", "cohyde.encoder_training.batch_size=8"],
}
BATCH = 16


def make_data(dest: Path, tools: int, per_tool: int) -> Path:
    """The first ``tools`` tools of the committed MetaTool sample, ``per_tool`` queries each."""
    from coevo.data.loaders import load_source

    if (dest / "data" / "dataset.json").exists():
        return dest / "data"
    src = REPO / "data" / "sample" / "metatool"
    descriptions = json.loads((src / "plugin_des.json").read_text())
    with (src / "all_clean_data.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    names = list(dict.fromkeys(r["Tool"] for r in rows))[:tools]
    keep = [r for t in names for r in [r for r in rows if r["Tool"] == t][:per_tool]]
    raw = dest / "source"
    raw.mkdir(parents=True, exist_ok=True)
    with (raw / "all_clean_data.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["Query", "Tool"])
        writer.writeheader()
        writer.writerows([{"Query": r["Query"], "Tool": r["Tool"]} for r in keep])
    (raw / "plugin_des.json").write_text(json.dumps({t: descriptions[t] for t in names}))
    return load_source("metatool", raw, seed=0, val_fraction=0.25, test_fraction=0.25, name="bench").save(dest / "data")


def experiment(uri: str, workdir: Path) -> str:
    """The id of the `bench-serve` experiment of the store, created on first use."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name("bench-serve")
    if found is not None:
        return found.experiment_id
    return client.create_experiment("bench-serve", artifact_location=(workdir / "mlruns").resolve().as_uri())


def train(workdir: Path, data: Path, method: str, generator: str):
    from coevo.config import load_params
    from coevo.methods.base import method_class
    from coevo.serving.search import from_run

    params = load_params(REPO / "params.yaml", ["seed=0", f"{method}.generator={generator}", *SETTINGS[method]])
    run_dir = workdir / "runs" / f"{method}-{generator}"
    started = time.perf_counter()
    method_class(method)(run_dir, params, data).run()
    print(f"  trained {method} ({generator}) in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    return from_run(method, run_dir, params, data)


def register(store: dict, retriever, name: str) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    from coevo.serving import registry
    from coevo.serving.pyfunc import log_retriever, tracking_uri

    client = MlflowClient(store["uri"], registry_uri=store["uri"])
    with tracking_uri(store["uri"]):
        with mlflow.start_run(experiment_id=store["experiment"]) as run:
            info = log_retriever(retriever)
        version = registry.register_version(client, name, source=info.model_uri, run_id=run.info.run_id,
                                            model_id=info.model_id)
    client.set_registered_model_alias(name, registry.CHAMPION, version)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(store: dict, name: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": store["uri"],
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{name}@champion",
                             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


def http_predict(url: str, queries: list[str]) -> list:
    body = json.dumps({"dataframe_records": [{"query": q} for q in queries]}).encode()
    request = urllib.request.Request(f"{url}/invocations", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["predictions"]


def timings(sides: dict, queries: list[str], requests: int, batches: int = 3) -> dict[str, dict[str, float]]:
    """Latency per single-query call and queries/s, for each side ({name: call(queries)}).

    The sides are measured interleaved, query by query, in alternating order, so a slower
    minute of a shared machine (or a long generation) falls on both alike; two warm-up calls
    each first. Batch throughput: ``batches`` calls of 16 queries each, interleaved too (median).
    """
    names = list(sides)
    for q in queries[:2]:
        for name in names:
            sides[name]([q])
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(requests):
        query = [queries[i % len(queries)]]
        for name in (names if i % 2 == 0 else names[::-1]):
            started = time.perf_counter()
            sides[name](query)
            seconds[name].append(time.perf_counter() - started)
    batch = (queries * BATCH)[:BATCH]
    batch_s: dict[str, list[float]] = {name: [] for name in names}
    for i in range(batches):
        for name in (names if i % 2 == 0 else names[::-1]):
            started = time.perf_counter()
            sides[name](batch)
            batch_s[name].append(time.perf_counter() - started)
    out = {}
    for name in names:
        ms = np.array(seconds[name]) * 1000
        out[name] = {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
                     "qps": float(len(ms) / (ms.sum() / 1000)), "batch_qps": float(BATCH / np.median(batch_s[name]))}
    return out


def train_in_subprocess(workdir: Path, data: Path, method: str, generator: str) -> None:
    """Train (or find finished) in a process of its own: the measuring process only loads models."""
    subprocess.run([sys.executable, __file__, "--train", method, generator, "--workdir", str(workdir),
                    "--data", str(data)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="single-query requests timed per side")
    parser.add_argument("--methods", default="cogr,grape,cohyde")
    parser.add_argument("--generators", default="tiny,smollm2-135m")
    parser.add_argument("--tools", type=int, default=8)
    parser.add_argument("--queries-per-tool", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None, help="keep runs here (default: a temporary folder)")
    parser.add_argument("--train", nargs=2, metavar=("METHOD", "GENERATOR"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.train:  # the subprocess of train_in_subprocess: train, log, register as champion
        method, generator = args.train
        uri = f"sqlite:///{args.workdir.resolve()}/mlflow.db"
        retriever = train(args.workdir, args.data, method, generator)
        register({"uri": uri, "experiment": experiment(uri, args.workdir)}, retriever,
                 f"coevo-{method}-bench_{generator}")
        return
    import mlflow
    import pandas as pd

    from coevo.serving.pyfunc import tracking_uri

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="coevo-bench-serve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = make_data(workdir, args.tools, args.queries_per_tool)
    from coevo.data.schema import Dataset

    queries = [str(t) for t in Dataset.load(data).queries_in("test")["text"]]
    uri = f"sqlite:///{workdir.resolve()}/mlflow.db"
    store = {"uri": uri, "experiment": experiment(uri, workdir)}
    print(f"CPU, torch threads={__import__('torch').get_num_threads()}, {len(queries)} distinct test queries, "
          f"{args.requests} single-query requests per side; workdir {workdir}", flush=True)
    results = []
    for generator in args.generators.split(","):
        for method in args.methods.split(","):
            name = f"coevo-{method}-bench_{generator}"
            train_in_subprocess(workdir, data, method, generator)
            with tracking_uri(uri):
                model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
            proc, url = serve(store, name, workdir / f"server-{name}.log")
            try:
                served = http_predict(url, queries[:2])
                local = model.predict(pd.DataFrame({"query": queries[:2]})).to_dict(orient="records")
                assert [[h["item_id"] for h in r["results"]] for r in served] == \
                    [[h["item_id"] for h in r["results"]] for r in local], "HTTP and in-process rankings differ"
                measured = timings({"in_process": lambda qs: model.predict(pd.DataFrame({"query": qs})),
                                    "http": lambda qs: http_predict(url, qs)}, queries, args.requests)
            finally:
                stop(proc)
            row = {"generator": generator, "method": method, **measured,
                   "ratio_p50": measured["http"]["p50_ms"] / measured["in_process"]["p50_ms"]}
            results.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"{'generator':14} {'method':7} {'in-proc p50/p95 ms':>20} {'HTTP p50/p95 ms':>18} {'q/s in/HTTP':>13} "
          f"{'batch q/s in/HTTP':>18} {'HTTP/in p50':>11}")
    for r in results:
        i, h = r["in_process"], r["http"]
        print(f"{r['generator']:14} {r['method']:7} {i['p50_ms']:9.1f} /{i['p95_ms']:8.1f} {h['p50_ms']:8.1f} /"
              f"{h['p95_ms']:8.1f} {i['qps']:6.1f}/{h['qps']:6.1f} {i['batch_qps']:8.1f}/{h['batch_qps']:8.1f} "
              f"{r['ratio_p50']:11.2f}")
    target = [r for r in results if r["method"] == "cogr" and r["generator"] == "smollm2-135m"]
    if target:
        print(f"serve_overhead_ratio={target[0]['ratio_p50']:.3f}")
    elif results:
        first = results[0]
        print(f"serve_overhead_ratio={first['ratio_p50']:.3f}   ({first['method']} with {first['generator']}; "
              f"the target is for cogr with smollm2-135m)")


if __name__ == "__main__":
    main()
