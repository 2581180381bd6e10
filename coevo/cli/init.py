"""`coevo init [DIR]`: a team's own project on an installed coevo.

The project holds what is the team's: its params (an overlay: `extends:` names the profiles coevo
ships, so an upgrade brings new knobs' defaults and no copied code needs editing), its data, the
Prefect deployments, one-line flow entry points, and git + DVC. Code stays in the installed package.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import typer

from coevo.cli.common import console, user_errors

PARAMS = """\
# {name}: a coevo project. This file holds what the project changes; every other knob comes from the
# profiles named in `extends:`, which ship with coevo (an upgrade brings new knobs with their defaults).
#   coevo params explain [KEY]   every knob: its type, range, value here and what it does
#   coevo run cogr               the whole pipeline (also: grape, cohyde); --set KEY=VALUE changes one knob once
extends: [defaults, cpu, demo]   # every default; then 2 CPU cores with the offline SmolLM2-135M; then the demo's
                                 # size (the sample in ~15 min). Drop `demo` for full runs, `cpu` on GPU workers.
data:
  dataset: metatool_sample       # name of data/processed/<dataset>/
  loader: metatool               # metatool | stabletoolbench | wands | beir | image_captions (coevo data --help)
  source: data/sample/metatool   # the MetaTool sample coevo ships; point at your own data
"""

FLOW = '''\
"""{help} `coevo run {name}`, `dvc repro` and prefect.yaml's deployments start it."""

from coevo.orchestration.flow import main, method_flow

{name}_flow = method_flow("{name}")

if __name__ == "__main__":
    main({name}_flow)
'''


def profile(name: str) -> Path:
    from coevo.config import PROFILES_DIR

    return PROFILES_DIR / name


def git_root(folder: Path) -> Path | None:
    """The top of the git work tree ``folder`` is in, if any."""
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True)
    return Path(done.stdout.strip()).resolve() if done.returncode == 0 else None


def init_project(folder: Path) -> list[str]:
    """Write a new project into ``folder`` (created if needed); the lines to show, in order.
    Refuses a folder that holds a params.yaml already, before writing anything."""
    from coevo.methods import SPECS
    from coevo.orchestration.dvc_record import dvc, write_record
    from coevo.orchestration.dvc_stages import DVC_FILE, read_records, render

    if (folder / "params.yaml").exists():
        raise ValueError(f"{folder / 'params.yaml'} exists: {folder} is a project already (coevo init starts one)")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder}: exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    done = []
    (folder / "params.yaml").write_text(PARAMS.format(name=folder.resolve().name))
    shutil.copytree(profile("metatool_sample"), folder / "data" / "sample" / "metatool", dirs_exist_ok=True)
    shutil.copyfile(profile("prefect.yaml"), folder / "prefect.yaml")
    shutil.copyfile(profile("gitignore"), folder / ".gitignore")
    (folder / "flows").mkdir(exist_ok=True)
    for spec in SPECS.values():
        (folder / "flows" / f"{spec.name}.py").write_text(FLOW.format(name=spec.name, help=spec.run_help))
    done.append(f"wrote params.yaml (extends coevo's defaults), prefect.yaml, .gitignore, flows/ "
                f"({', '.join(SPECS)}) and the MetaTool sample in data/sample/metatool")

    top = git_root(folder)
    if shutil.which("git") is None:
        done.append("git not found: no repository (DVC needs one; `git init && dvc init` later)")
    else:
        if top is None:
            subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
        inside = top is not None and top != folder.resolve()
        dvc("init", "-q", *(["--subdir"] if inside else []), root=folder)
        # dvc.yaml from the record of what `coevo run cogr` resolves here: `dvc repro` runs it
        from coevo.config import load_tree

        write_record("cogr", load_tree([folder / "params.yaml"]), folder)
        (folder / DVC_FILE).write_text(render(read_records(folder), folder))
        done.append(f"{'git repository and ' if top is None else ''}DVC initialised"
                    f"{' (a subfolder of ' + str(top) + ')' if inside else ''}; records/cogr.yaml and dvc.yaml: "
                    "`dvc repro` runs CoGR on the sample")
    return done


def register_top_level(root: typer.Typer) -> None:
    @root.command("init")
    def init(
        folder: Path = typer.Argument(Path("."), help="Folder of the new project (created if needed)."),
    ) -> None:
        """Start a project of your own on this installed coevo: params.yaml (an overlay on coevo's
        defaults), the MetaTool sample, prefect.yaml, flows/, .gitignore, git + DVC."""
        with user_errors():
            for line in init_project(folder):
                console.print(line, soft_wrap=True, highlight=False)
        where = "" if folder.resolve() == Path.cwd().resolve() else f"cd {folder} && "
        console.print(f"next: {where}coevo run cogr (about 15 minutes on 2 cores); `coevo params explain` lists "
                      "every knob; `git add -A && git commit` keeps the project", soft_wrap=True, highlight=False)
