"""Every command in the README's fenced code blocks is accepted as written (issue 24).

Each fenced block of README.md is read line by line: a line ending in ``\\`` continues on
the next, ``# ...`` comments are dropped, ``VAR=value`` environment assignments are skipped,
and ``&&`` / ``;`` / ``|`` split a line into commands (shell words via :mod:`shlex`, so
quoted queries stay one argument). In a block tagged as shell (```` ```bash ````, ``sh``,
``shell``, ``console``) every line is a command; an untagged block shows a program's output,
so only its lines with a ``$ `` prompt are commands (``$ python bench/scale_out.py``), not the
demo's ``coevo demo: CoGR on ...`` screen line. Two kinds of commands are checked:

- ``coevo ...`` (also ``$(which coevo) ...`` after ``accelerate launch``): parsed by the CLI's
  own click command (``typer.main.get_command(app)``), group by group with ``make_context``
  and ``resolve_command``, exactly as click does before it invokes a command, but without
  invoking anything. Every subcommand, option and option value (types, ranges, choices, no
  extra arguments) must be accepted; ``--help`` counts as accepted. A command with a
  ``--set`` option then loads its params as the command's first step does
  (``load_params(-p files, --set overrides)``; ``coevo demo`` reads params.yaml,
  params/cpu.yaml and params/demo.yaml), so an unknown key or a bad value fails too.
- ``python bench/<script>.py ...``: the script's ``main()`` runs with ``sys.argv`` set and
  ``argparse.ArgumentParser.parse_args`` patched to stop right after a successful parse, so
  the options are checked by the script's own parser and nothing else runs.

Nothing is skipped: placeholders such as ``runs:/<mlflow_run_id>`` or ``"..."`` are plain
argument strings the parser accepts as they stand (no command is run, no file is opened).
Other tools' commands (dvc, prefect, mlflow, ray, curl) are not checked here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from coevo.cli import app
from tests.conftest import REPO_ROOT

ROOT_COMMAND = typer.main.get_command(app)
# The click that built the command: typer >= 0.2x vendors its own copy (typer._click), older
# typers use the click package. Its UsageError is what a refused command line raises.
CLICK = importlib.import_module(type(ROOT_COMMAND).__mro__[1].__module__.rsplit(".", 1)[0])
UsageError = CLICK.exceptions.UsageError
EXITS = tuple({typer.Exit, getattr(CLICK.exceptions, "Exit", typer.Exit)})

README = REPO_ROOT / "README.md"
SEPARATORS = {";", "&&", "||", "|", "&"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
DEMO_PARAMS = [Path("params.yaml"), Path("params") / "cpu.yaml", Path("params") / "demo.yaml"]


@dataclass(frozen=True)
class Command:
    line: int  # README line the command starts on
    kind: str  # "coevo" or "bench"
    argv: tuple[str, ...]  # after `coevo`, or [script, args...] for bench

    def __str__(self) -> str:
        prog = "coevo" if self.kind == "coevo" else "python"
        return f"README.md:{self.line}: {shlex.join([prog, *self.argv])}"


SHELL_TAGS = {"bash", "sh", "shell", "console", "zsh"}


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of every command line of the fenced code blocks, continuations
    joined: every line of a shell block, the ``$ `` lines (prompt removed) of an untagged one."""
    out: list[tuple[int, str]] = []
    tag: str | None = None  # None: outside a block
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        fence = raw.strip()
        if fence.startswith("```"):
            tag = fence[3:].strip().lower() if tag is None else None
            pending = None
            continue
        if tag is None:
            continue
        if pending is not None:
            start, line = pending[0], pending[1] + raw
        elif tag in SHELL_TAGS:
            start, line = number, raw
        elif raw.lstrip().startswith("$ "):
            start, line = number, raw.lstrip()[2:]
        else:
            continue  # program output
        if line.rstrip().endswith("\\"):
            pending = (start, line.rstrip()[:-1] + " ")
            continue
        pending = None
        out.append((start, line))
    return out


def split_commands(line: str) -> list[list[str]]:
    """Shell words of each command on a line (comments dropped, split at ; && || | &)."""
    lexer = shlex.shlex(line.strip(), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: program output, not a command
        return []
    commands: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def readme_commands(text: str) -> list[Command]:
    found: list[Command] = []
    for number, line in fenced_lines(text):
        for words in split_commands(line):
            while words and ENV_ASSIGNMENT.match(words[0]):
                words = words[1:]
            if not words:
                continue
            if words[0] == "coevo":
                found.append(Command(number, "coevo", tuple(words[1:])))
            elif "$(which" in words and words.index("$(which") + 1 < len(words) \
                    and words[words.index("$(which") + 1] == "coevo)":
                found.append(Command(number, "coevo", tuple(words[words.index("$(which") + 2:])))
            elif words[0] in ("python", "python3") and len(words) > 1 and re.fullmatch(r"bench/\w+\.py", words[1]):
                found.append(Command(number, "bench", tuple(words[1:])))
    return found


def parse_coevo(argv: list[str]) -> typer.Context | None:
    """The leaf command's context as click builds it before invoking; None for --help.

    Raises UsageError (no such command or option, a bad value, an extra argument, a missing
    one) exactly where `coevo` would refuse the command line."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # --help's text
            ctx = ROOT_COMMAND.make_context("coevo", list(argv))
            while hasattr(ctx.command, "resolve_command"):  # a group: on to its subcommand
                rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
                if not rest:
                    raise UsageError("a command group without a command", ctx=ctx)
                name, cmd, rest = ctx.command.resolve_command(ctx, rest)
                ctx = cmd.make_context(name, rest, parent=ctx)
    except EXITS as stop:  # --help: printed its help, exit 0
        if stop.exit_code != 0:
            raise UsageError(f"exit {stop.exit_code}") from None
        return None
    return ctx


def check_params(ctx: typer.Context) -> None:
    """The command's params load as its first step would load them (-p files, then --set)."""
    overrides = ctx.params.get("overrides", ctx.params.get("set_"))
    if overrides is None:
        return
    from coevo.config import load_params

    # `coevo params explain|show` without -p read params.yaml (coevo/cli/params.py:_load), as run's default does
    paths = DEMO_PARAMS if ctx.info_name == "demo" else (ctx.params["params"] or [Path("params.yaml")])
    load_params(paths, list(overrides))


class _Parsed(Exception):
    """Raised by the patched parse_args once the arguments parsed."""


_ARGPARSE_PARSE = argparse.ArgumentParser.parse_args


def parse_bench(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run bench/<script>.py's main() until its argparse parser accepted ``argv[1:]``."""
    script = REPO_ROOT / argv[0]
    if not script.is_file():
        raise AssertionError(f"{argv[0]}: no such script")
    monkeypatch.setattr(sys, "path", list(sys.path))  # scripts put the project root first
    saved_env = dict(os.environ)  # scripts set defaults such as COEVO_THREADS at import time
    try:
        spec = importlib.util.spec_from_file_location(f"readme_bench_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "main"):
            raise AssertionError(f"{argv[0]}: no main() to check its arguments with")

        def parse_then_stop(self, args=None, namespace=None):
            _ARGPARSE_PARSE(self, args, namespace)
            raise _Parsed

        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        monkeypatch.setattr(sys, "argv", [str(script), *argv[1:]])
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                module.main()
        except _Parsed:
            return
        except SystemExit as exc:
            raise AssertionError(f"rejected (exit {exc.code}): {stderr.getvalue().strip()}") from None
        raise AssertionError("main() returned without parsing its arguments")
    finally:
        os.environ.clear()
        os.environ.update(saved_env)


def problems(commands: list[Command], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from coevo.config import ParamsError

    bad = []
    for command in commands:
        try:
            if command.kind == "coevo":
                ctx = parse_coevo(list(command.argv))
                if ctx is not None:
                    check_params(ctx)
            else:
                parse_bench(list(command.argv), monkeypatch)
        except UsageError as exc:
            bad.append(f"{command}\n    {exc.format_message()}")
        except (ParamsError, AssertionError, FileNotFoundError, ValueError) as exc:
            bad.append(f"{command}\n    {exc}")
    return bad


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # relative -p files as the README's commands name them


# ------------------------------------------------------------------------------- the README


def test_readme_lists_the_commands_it_documents():
    commands = readme_commands(README.read_text())
    coevo = [c for c in commands if c.kind == "coevo"]
    assert len(coevo) >= 20, "\n".join(map(str, commands))
    heads = {c.argv[0] for c in coevo if c.argv}
    assert {"demo", "run", "train", "data", "search", "evaluate", "promote", "ui"} <= heads, heads
    assert any(c.kind == "bench" and c.argv[0] == "bench/efficacy.py" for c in commands)
    # the multi-line commands arrive whole: continuation lines are joined
    assert any(c.argv[:2] == ("run", "cohyde") and "data.min_grade=1" in c.argv for c in coevo)
    # accelerate launch ... $(which coevo) train ...
    assert sum(c.argv[:2] == ("train", "cogr") for c in coevo) >= 3


def test_every_readme_command_is_accepted_by_its_parser(in_repo, monkeypatch):
    bad = problems(readme_commands(README.read_text()), monkeypatch)
    assert not bad, "README commands the parser refuses:\n" + "\n".join(bad)


def test_readme_does_not_describe_a_data_download_command():
    # `coevo data download` does not exist; data is fetched by `coevo data prepare wands --download`
    assert "data download" not in README.read_text()
    from coevo.cli import offline_models

    assert "data download" not in (offline_models.__doc__ or "")
    names = set(ROOT_COMMAND.commands["data"].commands)
    assert "download" not in names


# -------------------------------------------------------------------- the checker checks


BROKEN = """
Some prose with `coevo run cogr --set a=1 b=2` inline (not a block: not checked).

```bash
coevo run cogr --set cogr.rounds=3 cogr.seed=1      # two pairs after one --set
coevo data download metatool                         # no such command
coevo run cogr --stage train --no-such-option
coevo ui --port 0                                    # out of range
coevo run cogr --set cogr.no_such_knob=1             # parses, but params refuse it
coevo promote coevo-cogr-metatool_sample [--force]   # [--force] is an extra argument
python bench/efficacy.py --method cogr --data x --budget-min 60 --set cogr.rounds=1 cogr.seed=2
```
"""

GOOD = """
```bash
source .venv/bin/activate
coevo --help
coevo run cogr --set cogr.rounds=3 --set seed=1   # fine
coevo run grape -p params.yaml -p params/demo.yaml --set data.dataset=x \\
    --set data.min_grade=1
CUDA_VISIBLE_DEVICES=1 accelerate launch --num_processes 7 $(which coevo) train cogr --vllm \\
    --set cogr.rounds=1
coevo search -m runs:/<mlflow_run_id> "find me a recipe" && coevo promote some-model --force
python bench/efficacy.py --method cogr --data ../shared/data/metatool --budget-min 60 --set cogr.rounds=1
```
"""


def test_broken_commands_are_refused(in_repo, monkeypatch):
    commands = readme_commands(BROKEN)
    assert len(commands) == 7, commands
    bad = problems(commands, monkeypatch)
    assert len(bad) == 7, "\n".join(bad)
    assert "unexpected extra argument" in bad[0] and "cogr.seed=1" in bad[0]
    assert "No such command 'download'" in bad[1]
    assert "No such option" in bad[2]
    assert "--port" in bad[3]
    assert "no_such_knob" in bad[4]
    assert "[--force]" in bad[5]
    assert "unrecognized arguments: cogr.seed=2" in bad[6]


def test_good_commands_are_accepted(in_repo, monkeypatch):
    commands = readme_commands(GOOD)
    assert commands[0].argv == ("--help",)
    assert [c.argv[:2] for c in commands[1:]] == [
        ("run", "cogr"), ("run", "grape"), ("train", "cogr"), ("search", "-m"), ("promote", "some-model"),
        ("bench/efficacy.py", "--method"),
    ]
    assert commands[2].argv[-2:] == ("--set", "data.min_grade=1")  # the continuation joined
    assert commands[3].argv[:3] == ("train", "cogr", "--vllm")
    assert commands[4].argv[-1] == "find me a recipe"
    assert problems(commands, monkeypatch) == []


def test_every_command_of_the_expected_score_matrix_is_accepted(in_repo, monkeypatch):
    """repro/expected.yaml names, per entry, the command a person runs to see its figures."""
    from coevo.orchestration import repro_matrix as repro

    commands = []
    for entry in repro.load().entries:
        for words in split_commands(entry.command):
            while words and ENV_ASSIGNMENT.match(words[0]):
                words = words[1:]  # ONEDNN_MAX_CPU_ISA=AVX2 coevo ...
            assert words[0] == "coevo", f"{entry.id}: {entry.command}"
            commands.append(Command(0, "coevo", tuple(words[1:])))
    assert len(commands) >= len(repro.load().entries)
    bad = problems(commands, monkeypatch)
    assert not bad, "matrix commands the parser refuses:\n" + "\n".join(bad)
