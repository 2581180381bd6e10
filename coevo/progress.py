"""Step events from a running pipeline to whoever shows progress (the CLI draws a bar).

Flows call :func:`plan`, :func:`started` and :func:`finished`; trainers call
:func:`training_log` at each logged step (coevo.train.common.report_steps). A listener
registered with :func:`listening` receives them. Without a listener the events only count.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


class StepListener:
    def plan(self, total: int, title: str) -> None: ...
    def started(self, label: str) -> None: ...
    def finished(self, label: str, cached: bool) -> None: ...
    def notice(self, text: str) -> None: ...
    def training_log(self, series: str, step: int, values: Mapping[str, float]) -> None: ...


_listeners: list[StepListener] = []
_counts = {"executed": 0, "cached": 0}
_failed: set[int] = set()  # listeners whose training_log raised (warned once)


@contextmanager
def listening(listener: StepListener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
        _failed.discard(id(listener))  # an id may be reused by a later listener


def plan(total: int, title: str) -> None:
    _counts.update(executed=0, cached=0)
    for listener in _listeners:
        listener.plan(total, title)


def started(label: str) -> None:
    for listener in _listeners:
        listener.started(label)


def finished(label: str, cached: bool) -> None:
    _counts["cached" if cached else "executed"] += 1
    for listener in _listeners:
        listener.finished(label, cached)


def notice(text: str) -> None:
    """A one-line notice for the user (a step's outputs changed and it runs again); logged when
    nobody listens."""
    if not _listeners:
        logging.getLogger("coevo").warning(text)
    for listener in _listeners:
        listener.notice(text)


def series_name(what: str) -> str:
    """A trainer's description as a metric-name segment: "phase 01_query" -> "01_query",
    "round_1 DPO" -> "round_1_dpo"."""
    return re.sub(r"[^0-9a-z]+", "_", what.removeprefix("phase ").lower()).strip("_") or "training"


def training_log(what: str, step: int, values: Mapping[str, float]) -> None:
    """One logged training step (loss, reward mean and std, KL, ...) of the trainer ``what``.

    A listener that fails (a tracking store gone away) must not end an hour of training: the
    failure is logged once per listener and the step goes on."""
    series = series_name(what)
    for listener in list(_listeners):
        try:
            listener.training_log(series, step, values)
        except Exception as exc:  # noqa: BLE001 - the training matters more than its live chart
            if id(listener) not in _failed:
                _failed.add(id(listener))
                logging.getLogger("coevo").warning("live training metrics stopped (%s): %s", type(exc).__name__, exc)


def counts() -> dict[str, int]:
    return dict(_counts)
