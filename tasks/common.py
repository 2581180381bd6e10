"""What every pipeline task shares: cache policy, result storage, retries, fingerprints.

A task is cached on (its inputs) + (its own source) + (the source of the library packages it
calls). File inputs enter the key through their DVC-compatible md5 (`fingerprint`), so an
edited data or params file changes the key while an untouched one does not. Results are
persisted under the project folder `.prefect/results` (relative to the project root, the
working directory of every entry point: CLI, DVC stage, worker), never in ~/.prefect.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prefect import Task, task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy
from prefect.context import TaskRunContext
from prefect.states import State

RESULTS_DIR = Path(".prefect") / "results"
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET}

R = TypeVar("R")


def fingerprint(path: str | Path) -> str:
    """DVC's md5 of a file or folder (`<md5>` or `<md5>.dir`), or "absent".

    Computed with dvc-data, so the value equals what `dvc.lock` records for the same path
    and can be used both as a cache-key input and as an MLflow tag.
    """
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem
    from dvc_objects.fs.memory import MemoryFileSystem

    path = Path(path)
    if not path.exists():
        return "absent"
    staging = HashFileDB(MemoryFileSystem(), "/fingerprint")
    _, _, obj = build(staging, str(path.resolve()), LocalFileSystem(), "md5", dry_run=True)
    return str(obj.hash_info.value)


def package_source_hash(packages: Iterable[str]) -> str:
    """md5 over the source files of the named modules/packages (sorted, path-qualified)."""
    digest = hashlib.md5()
    for name in sorted(set(packages)):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            digest.update(f"{name}:missing".encode())
            continue
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
        for file in files:
            digest.update(f"{name}:{file.relative_to(origin.parent)}".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


@dataclass
class LibraryCode(CachePolicy):
    """Cache-key part: the source of the `coevo` packages a task calls.

    TASK_SOURCE only sees the task's own lines; the work happens in the library, so an edit
    there must invalidate the task too.
    """

    packages: tuple[str, ...] = field(default_factory=tuple)

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        return package_source_hash(self.packages) if self.packages else None


def is_transient(exc: BaseException) -> bool:
    """Errors worth a retry: network hiccups, busy files, interrupted I/O. Bad data is not."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def retry_if_transient(_task: Task, _task_run: Any, state: State) -> bool:
    exc = state.data if isinstance(state.data, BaseException) else None
    if exc is None:
        try:
            state.result(raise_on_failure=True)
        except BaseException as raised:  # noqa: BLE001 - we only classify it
            exc = raised
    return exc is not None and is_transient(exc)


def cache_policy(packages: Iterable[str] = ()) -> CachePolicy:
    return INPUTS + TASK_SOURCE + LibraryCode(packages=tuple(sorted(set(packages))))


def pipeline_task(
    *,
    name: str,
    packages: Iterable[str] = (),
    retries: int = 2,
    tags: Iterable[str] = (),
) -> Callable[[Callable[..., R]], Task[..., R]]:
    """`@task` with the project's cache policy, local result storage and transient retries."""
    return task(
        name=name,
        cache_policy=cache_policy(packages),
        persist_result=True,
        result_storage=RESULTS_DIR,
        retries=retries,
        retry_delay_seconds=[2, 10, 30][: max(retries, 1)],
        retry_condition_fn=retry_if_transient,
        tags=list(tags),
    )
