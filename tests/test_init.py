"""`coevo init [DIR]`: a team's own project on an installed coevo (issue 55, item 6). Its params.yaml
extends the profiles coevo ships, so the project resolves what `coevo demo` resolves here; the
slow test builds a wheel, installs it into a fresh virtual environment and runs the project there."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from coevo.cli import app
from conftest import REPO_ROOT, shared_prefect_env

runner = CliRunner()
DEMO = [REPO_ROOT / "params.yaml", REPO_ROOT / "params" / "cpu.yaml", REPO_ROOT / "params" / "demo.yaml"]


def _without_code(stages: dict) -> dict:
    return {name: {**stage, "deps": [d for d in stage.get("deps", []) if not d.startswith("coevo/")]}
            for name, stage in stages.items()}


def test_init_writes_a_project_that_resolves_what_the_demo_does(tmp_path):
    from coevo.config import load_tree
    from coevo.methods import SPECS

    project = tmp_path / "team"
    result = runner.invoke(app, ["init", str(project)])
    assert result.exit_code == 0, result.output
    assert "next: cd " in result.output

    assert load_tree([project / "params.yaml"]) == load_tree(DEMO)  # an overlay on the shipped profiles
    assert (project / "records" / "cogr.yaml").read_bytes() == (REPO_ROOT / "records" / "cogr.yaml").read_bytes()
    # the repository's dvc.yaml, less the code deps: the project's code is the installed coevo
    ours = yaml.safe_load((project / "dvc.yaml").read_text())
    theirs = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
    assert ours["stages"] == _without_code(theirs["stages"]) and ours["plots"] == theirs["plots"]
    assert not [d for s in ours["stages"].values() for d in s.get("deps", []) if d.startswith("coevo/")]
    sample = REPO_ROOT / "data" / "sample" / "metatool"
    for path in sample.iterdir():
        assert (project / "data" / "sample" / "metatool" / path.name).read_bytes() == path.read_bytes()
    # each deployment's entry point is a flow the project's flows/ defines
    for deployment in yaml.safe_load((project / "prefect.yaml").read_text())["deployments"]:
        file, name = deployment["entrypoint"].split(":")
        tree = ast.parse((project / file).read_text())
        assert name in {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets}, file
    assert sorted(p.stem for p in (project / "flows").glob("*.py")) == sorted(SPECS)
    assert (project / ".git").is_dir() and (project / ".dvc" / "config").is_file()
    assert (project / ".gitignore").read_text() == (REPO_ROOT / ".gitignore").read_text()

    before = (project / "params.yaml").read_bytes()
    again = runner.invoke(app, ["init", str(project)])
    assert again.exit_code == 2 and "is a project already" in again.output, again.output
    assert (project / "params.yaml").read_bytes() == before  # nothing overwritten


def test_init_inside_a_git_repository_makes_a_dvc_subproject(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    result = runner.invoke(app, ["init", str(tmp_path / "retrieval")])
    assert result.exit_code == 0, result.output
    assert "a subfolder of" in result.output and not (tmp_path / "retrieval" / ".git").exists()
    assert (tmp_path / "retrieval" / ".dvc" / "config").is_file()


def test_init_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "p").write_text("x")
    result = runner.invoke(app, ["init", str(tmp_path / "p")])
    assert result.exit_code == 2 and "exists and is not a folder" in result.output


# ------------------------------------------------------------------ from a wheel, in a fresh venv
WHEEL_SOURCES = ("pyproject.toml", "README.md", "coevo", "params.yaml", "params", "prefect.yaml", ".gitignore",
                 "data/sample/metatool")
TINY = ["--set", "cogr.generator=tiny", "--set", "cogr.rounds=0", "--set", "cogr.max_empty_share=1.0",
        "--set", "cogr.sft.epochs=1"]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment holding coevo from a wheel of this tree; its dependencies are the
    test environment's (a .pth line: that folder's own .pth files, the editable coevo's among them,
    are not read), so nothing is downloaded and the coevo it imports is the wheel's."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy: an in-tree build would leave build/ in the repository
    for name in WHEEL_SOURCES:
        src, dest = REPO_ROOT / name, source / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dest)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"),
                    str(source)], check=True, capture_output=True)
    [wheel] = (root / "dist").glob("coevo-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python*/site-packages")
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)
    return venv


@pytest.mark.slow
def test_a_wheel_installed_coevo_runs_an_initialised_project(wheel_venv, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PREFECT_API")}
    env.update(PATH=f"{wheel_venv / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PREFECT_HOME=str(tmp_path / "prefect-home"), DVC_NO_ANALYTICS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PREFECT_SERVER_ANALYTICS_ENABLED="false", **shared_prefect_env())
    coevo = str(wheel_venv / "bin" / "coevo")

    def sh(*args: str, cwd: Path) -> str:
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}\n{done.stderr}"
        return done.stdout

    imported = sh(str(wheel_venv / "bin" / "python"), "-c", "import coevo; print(coevo.__file__)", cwd=tmp_path)
    assert imported.startswith(str(wheel_venv)), imported  # the wheel's coevo, not the repository's

    sh(coevo, "init", "team", cwd=tmp_path)
    project = tmp_path / "team"
    sh("git", "add", "-A", cwd=project)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init", cwd=project)
    # the committed pipeline's data stages, run by DVC for real
    sh("dvc", "repro", "prepare-metatool_sample", "validate-metatool_sample", cwd=project)
    assert (project / "data" / "processed" / "metatool_sample" / "items.parquet").is_file()
    # and a whole run with a changed knob (the tiny model: seconds, not the demo's 15 minutes)
    out = sh(coevo, "run", "cogr", *TINY, cwd=project)
    assert "cogr: results" in out, out
    assert (project / "reports" / "cogr" / "metatool_sample").is_dir()
