"""Shared fixtures. Tests never reach a model hub; tests needing ../shared/data skip without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SAMPLE_DIR = REPO_ROOT / "data" / "sample"


def shared_data(name: str) -> Path:
    """Path to ../shared/data/<name>, or skip the calling test with the reason."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is absent (real public data lives there in CI, not in a user's clone)")
    return path


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    """A copy of the project's params.yaml that a test may edit."""
    dest = tmp_path / "params.yaml"
    dest.write_text((REPO_ROOT / "params.yaml").read_text())
    return dest


# --------------------------------------------------------------------------- toy projects
TOY_TOOLS = 6
QUERIES_PER_TOOL = 8


def make_toy_metatool(dest: Path) -> Path:
    """A MetaTool-format subset of the committed sample: 6 tools, 8 queries each."""
    from coevo.data.sample import toy_metatool

    return toy_metatool(SAMPLE_DIR / "metatool", dest, tools=TOY_TOOLS, queries_per_tool=QUERIES_PER_TOOL)


def toy_params(dest: Path) -> Path:
    """params.yaml with the toy data and a tiny model, one round, a handful of prompts."""
    import yaml

    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    params["data"].update(dataset="toy", loader="metatool", source="toy")
    cogr = params["cogr"]
    cogr.update(generator="tiny", seed_generator=None, rounds=1, max_empty_share=1.0)  # tiny writes few keywords
    cogr["sft"].update(epochs=1, batch_size=8)
    cogr["grpo"].update(num_generations=2, batch_size=4, max_prompts_per_phase=4, max_completion_length=12)
    cogr["sampling"].update(max_new_tokens=12)
    cogr["early_stopping"].update(patience=5)
    dest.write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


def make_project(root: Path, *, with_code: bool = False) -> Path:
    """A project folder for the flows: toy data, params.yaml, flows/ and tasks/ (and for DVC the code)."""
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    make_toy_metatool(root / "toy")
    toy_params(root / "params.yaml")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("coevo", "tasks", "flows") if with_code else ("tasks", "flows"):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=ignore)
    if with_code:
        shutil.copy(REPO_ROOT / ".dvcignore", root / ".dvcignore")
    return root


BIN = Path(sys.executable).parent  # the environment's commands: coevo, dvc


def sh(args: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a command as a user would; with ``check``, a failure shows its whole output."""
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def dvc_repo(root: Path, prefect_api_url: str) -> dict[str, str]:
    """``root`` (a ``make_project(..., with_code=True)`` folder) as a committed git + DVC repository;
    returns the environment its commands run in (the copied code first on the path, one Prefect server)."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PREFECT_HOME": str(root / ".prefect-home"),
        "PYTHONPATH": str(root),  # stage commands import the copied code, the one DVC hashes
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    sh(["git", "init", "-q"], root, env)
    sh([str(BIN / "dvc"), "init", "-q"], root, env)
    sh([str(BIN / "dvc"), "config", "core.analytics", "false"], root, env)
    (root / ".gitignore").write_text((REPO_ROOT / ".gitignore").read_text())
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "toy project"], root, env)
    env["PREFECT_API_URL"] = prefect_api_url  # one server for every command (each would start its own)
    return env


SHARED_PREFECT_ENV = "COEVO_TEST_PREFECT_API_URL"  # set by tests/run_by_file.py: its job slot's server


def shared_prefect_api(timeout_s: float = 180.0) -> str | None:
    """The API URL of the Prefect server tests/run_by_file.py started for this job slot, once it
    answers; None when the tests run without one (plain pytest): then each flow starts its own."""
    import time
    import urllib.request

    url = os.environ.get(SHARED_PREFECT_ENV)
    if not url:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return url
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{SHARED_PREFECT_ENV}={url}: no answer from the job slot's Prefect server "
                               f"after {timeout_s:.0f}s (its log: the run's prefect-server-*.log)")
        time.sleep(0.5)


def shared_prefect_env() -> dict[str, str]:
    """``PREFECT_API_URL`` of the job slot's server for a command's environment ({} without one)."""
    shared = shared_prefect_api()
    return {"PREFECT_API_URL": shared} if shared else {}


@pytest.fixture(scope="session")
def prefect_server():
    """One Prefect server for every flow test of the session (each start costs ~15 s): the job slot's
    (tests/run_by_file.py), else a test server of this session's own."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls from tests
    import prefect.context
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    shared = shared_prefect_api()
    if shared:
        # as prefect_test_harness does: the settings of this context and of the process (threads)
        with temporary_settings(updates={PREFECT_API_URL: shared}), \
                prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
            yield shared
        return

    with prefect_test_harness(server_startup_timeout=None):
        from prefect.server.api.server import SubprocessASGIServer

        yield SubprocessASGIServer._instances[None].api_url


@pytest.fixture
def chdir():
    """chdir(path) for the rest of the test; the working directory is restored afterwards."""
    previous = Path.cwd()
    yield os.chdir
    os.chdir(previous)


def task_states(flow_run_id: str):
    """(task name, state name) counts of one flow run, from the Prefect API."""
    from collections import Counter

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return Counter((r.name, r.state.name) for r in runs)
