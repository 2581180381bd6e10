"""Import rules of the library, read from the source with ``ast`` (nothing is imported).

Imports go one way: the library (``coevo/`` minus ``cli/``, ``orchestration/`` and ``serving/``)
-> ``coevo/orchestration/`` (Prefect tasks, MLflow tracking, DVC records, the flow builder) ->
the entry points (``coevo/cli/``, the top-level ``flows/`` and ``tasks/``, ``bench/``).

- ``coevo/`` never imports the top-level ``tasks`` or ``flows`` folders (they are a project's
  thin entry points over ``coevo.orchestration``, not installed);
- the library never imports ``coevo.orchestration`` (nor ``coevo.cli``);
- ``coevo/models`` never imports ``coevo.train`` (train builds on models);
- ``coevo/orchestration/``, ``tasks/`` and ``flows/`` never import ``coevo.cli`` (orchestration
  runs without a CLI);
- the library never imports ``prefect``, ``mlflow`` or ``dvc``: ``prefect`` and ``dvc`` only
  under ``coevo/cli/`` and ``coevo/orchestration/``, ``mlflow`` there and under ``coevo/serving/``
  (the MLflow pyfunc model *is* the serving interface). DVC's hashing library (``dvc_data``,
  the md5 of :func:`coevo.steps.fingerprint`) is not ``dvc``;
- no source file under ``coevo/``, ``flows/``, ``tasks/`` or ``bench/`` edits ``sys.path``: the
  code they import is the installed package (a script's own folder is on its path already);
- only ``coevo*`` packages are installed (no bare ``tasks`` / ``flows`` in site-packages).

Relative imports are resolved, ``from coevo import train`` counts as importing ``coevo.train``,
imports under ``if TYPE_CHECKING:`` and inside functions count, and so do
``importlib.import_module("...")`` / ``__import__("...")`` calls whose module name is a
literal (or an f-string with a literal head, e.g. ``f"flows.{method}"``).
Every violation names the file, the line and the imported module.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
LIBRARY = REPO_ROOT / "coevo"


class Import(NamedTuple):
    path: Path  # relative to the repository root
    line: int
    module: str  # absolute dotted name

    def describe(self, rule: str) -> str:
        return f"{self.path}:{self.line}: imports {self.module} ({rule})"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(path: Path, module: str | None, level: int) -> str:
    """Absolute name of ``from <level dots><module> import ...`` written in ``path``."""
    if level == 0:
        return module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()  # a module's package is its parent
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _literal_head(node: ast.expr) -> str | None:
    """The module name of a dynamic import when it is (or starts with) a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rstrip(".") or None
    return None


def _is_dynamic_import(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def imports_of(path: Path) -> Iterator[Import]:
    rel = path.relative_to(REPO_ROOT)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(rel, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(path, node.module, node.level)
            yield Import(rel, node.lineno, base)
            for alias in node.names:
                if alias.name != "*":
                    yield Import(rel, node.lineno, f"{base}.{alias.name}" if base else alias.name)
        elif isinstance(node, ast.Call) and _is_dynamic_import(node) and node.args:
            name = _literal_head(node.args[0])
            if name:
                yield Import(rel, node.lineno, name)


def library_imports() -> list[Import]:
    files = sorted(LIBRARY.rglob("*.py"))
    assert files, f"no Python files under {LIBRARY}"
    return [imp for path in files for imp in imports_of(path)]


def _is(module: str, *names: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def violations(rule: str, applies: Callable[[Path], bool], forbidden: Callable[[str], bool]) -> list[str]:
    seen: dict[tuple[Path, int], Import] = {}
    for imp in library_imports():
        if applies(imp.path) and forbidden(imp.module):
            seen.setdefault((imp.path, imp.line), imp)  # one message per import statement
    return [imp.describe(rule) for imp in seen.values()]


def _under(folder: str) -> Callable[[Path], bool]:
    prefix = Path(folder).parts
    return lambda path: path.parts[: len(prefix)] == prefix


def _library(path: Path) -> bool:
    """A file of the library: under coevo/, outside cli/, orchestration/ and serving/."""
    return _under("coevo")(path) and not any(_under(f"coevo/{part}")(path) for part in ("cli", "orchestration",
                                                                                         "serving"))


def test_library_never_imports_tasks_or_flows():
    found = violations("coevo/ never imports the top-level tasks or flows",
                       _under("coevo"), lambda m: _is(m, "tasks", "flows"))
    assert not found, "\n".join(found)


def test_library_never_imports_orchestration_or_the_cli():
    """One direction: library -> coevo.orchestration -> entry points."""
    found = violations("the library never imports coevo.orchestration or coevo.cli", _library,
                       lambda m: _is(m, "coevo.orchestration", "coevo.cli"))
    found += violations("coevo.serving never imports coevo.orchestration or coevo.cli", _under("coevo/serving"),
                        lambda m: _is(m, "coevo.orchestration", "coevo.cli"))
    assert not found, "\n".join(found)


def test_orchestration_tasks_and_flows_never_import_the_cli():
    """Orchestration builds on the library, never on its command line (a flow started by a
    deployment has no CLI around it): the tracking store is opened by coevo/orchestration/tracking.py."""
    found = violations("coevo/orchestration/ never imports coevo.cli", _under("coevo/orchestration"),
                       lambda m: _is(m, "coevo.cli"))
    found += [imp.describe("tasks/ and flows/ never import coevo.cli")
              for folder in ("tasks", "flows") for path in sorted((REPO_ROOT / folder).rglob("*.py"))
              for imp in imports_of(path) if _is(imp.module, "coevo.cli")]
    assert not found, "\n".join(found)


def test_models_never_import_train():
    found = violations("coevo/models never imports coevo.train",
                       _under("coevo/models"), lambda m: _is(m, "coevo.train"))
    assert not found, "\n".join(found)


def test_prefect_mlflow_and_dvc_only_in_orchestration_and_the_cli():
    cli, orchestration, serving = _under("coevo/cli"), _under("coevo/orchestration"), _under("coevo/serving")
    outside = lambda p: _under("coevo")(p) and not cli(p) and not orchestration(p)  # noqa: E731
    found = violations("prefect only under coevo/cli/ and coevo/orchestration/", outside, lambda m: _is(m, "prefect"))
    found += violations("dvc only under coevo/cli/ and coevo/orchestration/", outside, lambda m: _is(m, "dvc"))
    found += violations("mlflow only under coevo/cli/, coevo/orchestration/ and coevo/serving/",
                        lambda p: outside(p) and not serving(p), lambda m: _is(m, "mlflow"))
    assert not found, "\n".join(found)


def test_compute_leaves_orchestration_to_the_orchestration_package():
    """coevo/compute.py runs work (generation, embedding) and never builds a pipeline: rebuilding a
    pipeline's step on a Ray worker is orchestration, in coevo/orchestration/prefect_tasks.py."""
    found = violations("coevo/compute.py never imports coevo.orchestration or coevo.methods",
                       lambda p: p == Path("coevo/compute.py"),
                       lambda m: _is(m, "coevo.orchestration", "coevo.methods"))
    assert not found, "\n".join(found)


def _private(module: str) -> bool:
    """``coevo.models.registry._resolve``: a project module's private name (not a dunder)."""
    parts = module.split(".")
    return parts[0] in ("coevo", "tasks", "flows") and any(
        part.startswith("_") and not part.startswith("__") for part in parts[1:])


def test_no_module_imports_another_modules_private_names():
    """What one module uses of another is public (named without a leading underscore)."""
    found = [imp.describe("no private name of another module") for folder in ("coevo", "tasks", "flows")
             for path in sorted((REPO_ROOT / folder).rglob("*.py")) for imp in imports_of(path)
             if _private(imp.module) and not imp.module.startswith(_module_name(path) + ".")]
    assert not found, "\n".join(found)


def test_only_coevo_packages_are_installed():
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    others = [pattern for pattern in include if not pattern.startswith("coevo")]
    assert include and not others, (
        f"pyproject.toml [tool.setuptools.packages.find] include = {include}: only coevo* may be installed "
        f"(not {others}: a bare top-level package collides in site-packages)"
    )


_PATH_MUTATORS = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort", "__setitem__",
                  "__delitem__", "__iadd__"}


def _is_sys_path(node: ast.expr, path_names: set[str]) -> bool:
    """``sys.path`` (``import sys``), or a name bound by ``from sys import path``."""
    if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name):
        return node.value.id == "sys"
    return isinstance(node, ast.Name) and node.id in path_names


def sys_path_edits(path: Path) -> Iterator[str]:
    """``<file>:<line>: <what>`` for each edit of the import path in ``path``: a mutating call on
    ``sys.path`` (insert, append, extend, ...), an assignment to it or to an item or slice of it,
    ``del sys.path[...]``, ``sys.path += ...``, and ``site.addsitedir(...)``."""
    rel = path.relative_to(REPO_ROOT)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
    names = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "sys" for alias in node.names if alias.name == "path"}

    def target(node: ast.expr) -> bool:
        return _is_sys_path(node.value if isinstance(node, ast.Subscript) else node, names)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _PATH_MUTATORS and _is_sys_path(node.func.value, names):
                yield f"{rel}:{node.lineno}: sys.path.{node.func.attr}(...)"
            elif node.func.attr == "addsitedir" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "site":
                yield f"{rel}:{node.lineno}: site.addsitedir(...)"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            if any(target(t) for t in targets):
                yield f"{rel}:{node.lineno}: {type(node).__name__.lower()} to sys.path"


def test_no_source_edits_sys_path():
    """coevo/, flows/, tasks/ and bench/ import the installed package: nothing puts a folder on the
    import path (a flow file, prefect.yaml's entrypoint, imports coevo.orchestration; a bench
    script's sibling modules are on its path already, as its own folder)."""
    found = [edit for folder in ("coevo", "flows", "tasks", "bench")
             for path in sorted((REPO_ROOT / folder).rglob("*.py")) for edit in sys_path_edits(path)]
    assert not found, "\n".join(found)


# A parameter of these names is one of the project's own types; `Any` there hides what it is.
PROJECT_TYPES = {"params": "Params", "pipe": "Pipeline", "pipeline": "Pipeline", "method": "Method", "step": "Step",
                 "retriever": "Retriever", "tracker": "Tracker", "run": "Method", "dataset": "Dataset",
                 "generator": "Generator"}


def test_no_public_signature_types_a_project_object_as_any():
    """Type hints are free to fix: a code key leaves them out (coevo.steps.code_of), so no run re-trains."""
    found = []
    for folder in ("coevo", "tasks", "flows", "bench"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                    found += [f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}({a.arg}: Any): "
                              f"expected {PROJECT_TYPES[a.arg]}" for a in arguments
                              if a.arg in PROJECT_TYPES and a.annotation is not None and ast.unparse(a.annotation) == "Any"]
    assert not found, "\n".join(found)


def test_the_gpu_extra_takes_vllm_through_the_pinned_trls_own_extra():
    """vLLM at a version the pinned TRL supports: the gpu extra names TRL's `vllm` extra at the core
    pin (a TRL bump that forgets the extra fails here), the installed TRL declares that extra, and
    no faiss-gpu (it installs the same `faiss` module as faiss-cpu)."""
    import importlib.metadata

    from packaging.requirements import Requirement

    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    core = {r.name: r for r in map(Requirement, config["project"]["dependencies"])}
    gpu = {r.name: r for r in map(Requirement, config["project"]["optional-dependencies"]["gpu"])}
    assert set(gpu) == {"trl"} and gpu["trl"].extras == {"vllm"}, gpu
    assert str(gpu["trl"].specifier) == str(core["trl"].specifier) == f"=={importlib.metadata.version('trl')}"
    declared = [Requirement(r) for r in importlib.metadata.requires("trl") or ()]
    vllm = [r for r in declared if r.name == "vllm" and r.marker and r.marker.evaluate({"extra": "vllm"})]
    assert vllm and vllm[0].specifier, "the installed TRL declares no pinned vllm extra"
    extras = [r for group in config["project"]["optional-dependencies"].values() for r in group]
    assert not [r for r in extras if Requirement(r).name.startswith("faiss-gpu")]


# -- the walker itself -----------------------------------------------------------------------
def test_the_walker_sees_every_kind_of_import(tmp_path, monkeypatch):
    package = tmp_path / "coevo" / "models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = (
        "import os\n"
        "from coevo import train\n"
        "from ..train.grpo import wrap_reward\n"
        "from . import prompts\n"
        "def f(method):\n"
        "    import importlib\n"
        "    import flows.cogr\n"
        "    return importlib.import_module(f'tasks.{method}'), __import__('mlflow')\n"
    )
    (package / "bad.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    got = {(imp.line, imp.module) for imp in imports_of(package / "bad.py")}
    assert {(1, "os"), (2, "coevo.train"), (3, "coevo.train.grpo"), (4, "coevo.models.prompts"),
            (7, "flows.cogr"), (8, "tasks"), (8, "mlflow")} <= got
    assert _resolve(package / "__init__.py", "tiny", 1) == "coevo.models.tiny"
    assert _private("coevo.models.registry._resolve") and not _private("coevo.methods.__init__")
    assert not _private("_thread") and not _private("coevo.models.registry.resolve_model_source")
    assert Import(Path("coevo/models/bad.py"), 2, "coevo.train").describe("rule") == (
        "coevo/models/bad.py:2: imports coevo.train (rule)"
    )


def test_the_sys_path_walker_sees_every_kind_of_edit(tmp_path, monkeypatch):
    script = tmp_path / "bench" / "bad.py"
    script.parent.mkdir()
    script.write_text(
        "import site\n"
        "import sys\n"
        "from sys import path as where\n"
        "sys.path.insert(0, 'x')\n"
        "sys.path.append('x')\n"
        "sys.path[:0] = ['x']\n"
        "sys.path = ['x']\n"
        "sys.path += ['x']\n"
        "where.insert(0, 'x')\n"
        "site.addsitedir('x')\n"
        "del sys.path[0]\n"
        "print(sys.path, sys.path[0], 'sys.path.insert')\n"  # reading it is fine
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    lines = [int(found.split(":")[1]) for found in sys_path_edits(script)]
    assert sorted(lines) == [4, 5, 6, 7, 8, 9, 10, 11], lines
