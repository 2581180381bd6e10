"""One Prefect task per pipeline step, built by one factory.

The task's cache key is the step's key (``coevo.steps``: the one staleness rule), so a
Prefect cache hit happens exactly when the library would call the step done; when the
library says it is not done (an output vanished), the cache is refreshed. Results are small
JSON documents (Prefect's JSON serializer, never pickle) under the project's
``.prefect/results``; only transient errors are retried.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TYPE_CHECKING

from prefect import task
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext

from coevo import progress
from coevo.memory import release_freed_memory
from coevo.orchestration.pipeline import Pipeline, Step

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from coevo.config import Params

RESULTS_DIR = Path(".prefect") / "results"
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET}


class StepKey(CachePolicy):
    """Cache key = the step's own key (its inputs, params subtree and code)."""

    def compute_key(self, task_ctx: TaskRunContext, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        return inputs["key"]


def is_transient(exc: BaseException) -> bool:
    """Errors worth a retry: network hiccups, busy files, interrupted I/O. Bad data is not."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def _retry_if_transient(_task: Any, _task_run: Any, state: Any) -> bool:
    try:
        state.result(raise_on_failure=True)
    except BaseException as raised:  # noqa: BLE001 - only classified
        return is_transient(raised)
    return False


@task(cache_policy=StepKey(), persist_result=True, result_storage=RESULTS_DIR, result_serializer="json",
      retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=_retry_if_transient)
def _step(step: Step, key: str) -> dict[str, Any]:
    try:
        return step.run()
    finally:
        release_freed_memory()  # the next step starts from what this one really keeps, not from its peak


def execute(step: Step) -> dict[str, Any]:
    """Run ``step`` as its own Prefect task; report progress; return its result."""
    progress.started(step.label)
    done = step.done()  # the library's resume check, with the same key
    task_obj = _step.with_options(name=step.name, task_run_name=step.name, refresh_cache=not done)
    state = task_obj(step=step, key=step.key, return_state=True)
    result = state.result()  # raises the step's own exception on failure
    progress.finished(step.label, cached=done or state.name == "Cached")
    return result


# ------------------------------------------------------------------------------ on Ray
@task(cache_policy=StepKey(), persist_result=True, result_serializer="json",
      retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=_retry_if_transient)
def _remote_step(build: Callable[[], Step], key: str) -> dict[str, Any]:
    """``_step`` for a Ray worker: the step is rebuilt where it runs (its closures hold the
    pipeline and loaded models, which must not travel); same cache key, same result file."""
    try:
        return build().run()
    finally:
        release_freed_memory()


def rebuild_step(method: str, params: Params, project: str, name: str, key: str) -> Step:
    """The evaluate-stage step ``name`` of ``method``'s pipeline, rebuilt on a Ray worker.

    A step's closures hold the pipeline and its loaded models, which must not travel; a worker
    rebuilds the step from the params in the project folder (shared storage on a cluster) and
    checks that it computes the same key as the driver did.
    """
    os.chdir(project)
    pipe = Pipeline(method, params)
    steps = {s.name: s for s in pipe.baseline_steps()}
    if name not in steps:
        raise ValueError(f"{name!r} is not an independent evaluate step of {method} ({', '.join(steps)})")
    step = steps[name]
    if step.key != key:
        raise RuntimeError(f"{name}: the Ray worker computes key {step.key}, the driver {key}: the project folder "
                           f"{project} differs between them (put it on shared storage)")
    return step


@contextlib.contextmanager
def fan_out(pipe: Pipeline) -> Iterator[Callable[[Step], Callable[[], dict[str, Any]]]]:
    """``submit(step) -> wait()`` for steps that depend on nothing still running.

    With ``compute.backend: ray`` each submitted step is a Prefect task on Ray
    (``prefect_ray.RayTaskRunner``: the configured cluster, $RAY_ADDRESS or a local instance)
    and runs while the flow goes on; ``wait()`` returns its result. Cache key, result file
    (``<project>/.prefect/results``), retries and progress lines are those of :func:`execute`,
    so a step cached by one runner is a cache hit for the other. Otherwise ``submit`` runs the
    step in place through :func:`execute`.
    """
    from coevo.compute import is_ray

    if not is_ray(pipe.params.compute):
        def run_here(step: Step) -> Callable[[], dict[str, Any]]:
            result = execute(step)
            return lambda: result

        yield run_here
        return
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    from coevo.compute import ray_init_args

    project = Path.cwd()
    address, init_kwargs = ray_init_args(pipe.params.compute)
    # Workers import the code the driver imports: the project folder first (a project may hold its own
    # copy of coevo, as DVC-tracked projects do), then the installed package (coevo.orchestration).
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(project), os.environ.get("PYTHONPATH", "")) if p)}
    with RayTaskRunner(address=address, init_kwargs=init_kwargs) as runner, \
            remote_options(num_cpus=1, runtime_env={"env_vars": env}):

        def submit(step: Step) -> Callable[[], dict[str, Any]]:
            progress.started(step.label)
            done = step.done()
            task_obj = _remote_step.with_options(name=step.name, task_run_name=step.name, refresh_cache=not done,
                                                 result_storage=project / RESULTS_DIR)  # a Path: absolute
            build = functools.partial(rebuild_step, pipe.name, pipe.params, str(project), step.name, step.key)
            future = runner.submit(task_obj, parameters={"build": build, "key": step.key})

            def wait() -> dict[str, Any]:
                result = future.result()  # raises the step's own exception on failure
                progress.finished(step.label, cached=done or future.state.name == "Cached")
                return result

            return wait

        yield submit
