"""A run resolves its params once (issue 55, item 3): `coevo run`, `coevo demo` and a flow started
directly (a deployment) read the params files once, build one Pipeline, take the run folder's
lock once and check the stage once; the resolved tree travels to the flow as a plain dict, and
the step keys (the Prefect cache keys) do not depend on how the params arrived.

Counted in-process on the toy project of the flow tests (`cogr.generator=tiny`, no GRPO round).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import make_project

pytestmark = pytest.mark.slow

FAST = ["--set", "cogr.rounds=0"]  # seed + SFT only: the smallest whole run the flow tests use


@dataclass
class Counts:
    loads: int = 0  # params resolutions (coevo.config.load_tree: files in order, then --set)
    files: list[str] = field(default_factory=list)  # params files read (coevo.config._read_yaml)
    pipelines: int = 0  # Pipeline constructions
    locks: int = 0  # acquisitions of the run folder's lock (nested ones included)
    stage_checks: int = 0  # check_stage calls

    def as_tuple(self) -> tuple[int, int, int, int]:
        return self.loads, self.pipelines, self.locks, self.stage_checks


def _replace_everywhere(monkeypatch, original, replacement) -> None:
    """``replacement`` wherever a loaded module holds ``original`` by name (``from x import f`` included)."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if value is original:
                monkeypatch.setattr(module, name, replacement)


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Counters around the params loader, Pipeline, the run lock and check_stage, for the block."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield _count(monkeypatch)


@pytest.fixture
def counts(monkeypatch) -> Counts:
    return _count(monkeypatch)


def _count(monkeypatch) -> Counts:
    import filelock

    import coevo.cli.run  # noqa: F401 - every module that imports the counted functions, loaded first
    import coevo.cli.train  # noqa: F401
    import coevo.config as config
    import coevo.orchestration.flow  # noqa: F401
    import coevo.orchestration.pipeline as pipeline
    from coevo.orchestration.lock import lock_path

    seen = Counts()
    load_tree, read_yaml, check_stage = config.load_tree, config._read_yaml, pipeline.check_stage
    init, acquire = pipeline.Pipeline.__init__, filelock.BaseFileLock.acquire

    def counted_load_tree(*args, **kwargs):
        seen.loads += 1
        return load_tree(*args, **kwargs)

    def counted_read_yaml(path):
        seen.files.append(str(path))
        return read_yaml(path)

    def counted_check_stage(stage):
        seen.stage_checks += 1
        return check_stage(stage)

    def counted_init(self, *args, **kwargs):
        seen.pipelines += 1
        init(self, *args, **kwargs)

    run_lock_file = lock_path(Path("data/models/cogr/toy"))  # resolved against the project, when it is the cwd

    def counted_acquire(self, *args, **kwargs):
        if Path(self.lock_file).name == run_lock_file.name:
            seen.locks += 1
        return acquire(self, *args, **kwargs)

    _replace_everywhere(monkeypatch, load_tree, counted_load_tree)
    _replace_everywhere(monkeypatch, check_stage, counted_check_stage)
    monkeypatch.setattr(config, "_read_yaml", counted_read_yaml)
    monkeypatch.setattr(pipeline.Pipeline, "__init__", counted_init)
    monkeypatch.setattr(filelock.BaseFileLock, "acquire", counted_acquire)
    return seen


@pytest.fixture(scope="module")
def finished(tmp_path_factory, prefect_server) -> tuple[Path, str, Counts]:
    """The toy project after one whole `coevo run cogr` (counted), with the two overlays `coevo demo`
    reads (here: nothing but the fast settings)."""
    root = make_project(tmp_path_factory.mktemp("read_once"))
    (root / "params").mkdir()
    (root / "params" / "cpu.yaml").write_text("cogr:\n  rounds: 0\n")
    (root / "params" / "demo.yaml").write_text("{}\n")
    previous = Path.cwd()
    os.chdir(root)
    try:
        with counting() as seen:
            output = coevo("run", "cogr", *FAST).output
    finally:
        os.chdir(previous)
    return root, output, seen


@pytest.fixture
def in_project(finished, chdir) -> Path:
    chdir(finished[0])
    return finished[0]


def coevo(*args: str):
    from typer.testing import CliRunner

    from coevo.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_coevo_run_reads_params_once_builds_one_pipeline_takes_one_lock(finished):
    _, output, counts = finished
    assert "cogr: results" in output, output
    assert counts.files == ["params.yaml"], counts
    assert counts.as_tuple() == (1, 1, 1, 1), counts


def test_an_up_to_date_run_and_coevo_demo_read_once(in_project, counts):
    """The answer without Prefect (the finished run above), and `coevo demo`'s own path (its
    numerics line and the run read the same resolution: params.yaml + params/cpu.yaml + params/demo.yaml)."""
    assert "up to date" in coevo("run", "cogr", *FAST).output
    assert counts.as_tuple() == (1, 1, 1, 1), counts
    counts.__init__()
    assert "up to date" in coevo("demo").output
    assert counts.files == ["params.yaml", "params/cpu.yaml", "params/demo.yaml"], counts
    assert counts.as_tuple() == (1, 1, 1, 1), counts


def test_a_stage_run_with_its_flow_reads_once(in_project, counts):
    """`dvc repro`'s call (`coevo run <m> -p <record> --stage X`), the flow started even though it is up to date."""
    shutil.copy("params.yaml", "record.yaml")
    coevo("run", "cogr", "-p", "record.yaml", *FAST, "--stage", "prepare", "--log-run")
    assert counts.files == ["record.yaml"], counts
    assert counts.as_tuple() == (1, 1, 1, 1), counts


def test_a_deployment_loads_from_its_files_or_takes_the_resolved_tree(in_project, counts):
    """A deployment calls the flow with file paths (read once there) or with a resolved tree (read nowhere)."""
    from coevo.config import load_tree
    from flows.cogr import cogr_flow

    cogr_flow(params_path="params.yaml", overrides=["cogr.rounds=0"], stage="prepare")
    assert counts.files == ["params.yaml"], counts
    assert counts.as_tuple() == (1, 1, 1, 1), counts
    tree = json.loads(json.dumps(load_tree("params.yaml", ["cogr.rounds=0"])))  # as a deployment's JSON carries it
    counts.__init__()
    cogr_flow(resolved=tree, stage="prepare")
    assert counts.files == [], counts
    assert counts.as_tuple() == (0, 1, 1, 1), counts


def test_step_keys_depend_on_the_resolved_values_only(in_project):
    """The same values from a file + --set, from a file holding them, or as a JSON-carried tree: same keys."""
    from coevo.config import load_params, load_tree, params_from_tree
    from coevo.orchestration.pipeline import Pipeline

    overrides = ["cogr.rounds=0", "cogr.sft.learning_rate=0.001"]
    tree = load_tree("params.yaml", overrides)
    Path("resolved.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    ways = [load_params("params.yaml", overrides, method="cogr"), load_params("resolved.yaml", method="cogr"),
            params_from_tree(json.loads(json.dumps(tree)), method="cogr")]

    def keys(params) -> dict[str, str]:
        pipe = Pipeline("cogr", params)
        steps = [pipe.prepare(), pipe.validate(), *(pipe.phase_step(p.name) for p in pipe.method.phases()),
                 *pipe.evaluate_steps()]
        return {s.name: s.key for s in steps}

    first, *others = [keys(p) for p in ways]
    assert len(first) > 6 and all(k == first for k in others)


def test_a_handed_over_train_stage_gets_the_resolved_tree_as_json(monkeypatch):
    """`train_deployment`: the deployment's flow run gets the run's resolved tree, a plain JSON parameter."""
    import prefect.deployments

    from coevo.config import PROJECT_PARAMS, load_tree
    from coevo.orchestration.flow import train_elsewhere

    asked = {}

    class Completed:
        name = "Completed"

        def is_completed(self) -> bool:
            return True

    def run_deployment(name, parameters):
        asked.update(name=name, parameters=json.loads(json.dumps(parameters)))  # what the API would store
        return type("FlowRun", (), {"state": Completed()})()

    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment)
    tree = load_tree(PROJECT_PARAMS, ["cogr.rounds=0"])
    train_elsewhere("cogr/train-gpu", ["params.yaml"], ["cogr.rounds=0"], live_run_id="run-1", resolved=tree)
    assert asked == {"name": "cogr/train-gpu", "parameters": {
        "params_path": ["params.yaml"], "overrides": ["cogr.rounds=0"], "stage": "train", "live_run_id": "run-1",
        "resolved": tree}}
