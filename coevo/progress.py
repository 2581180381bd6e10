"""Step events from a running pipeline to whoever shows progress (the CLI draws a bar).

Flows call :func:`plan`, :func:`started` and :func:`finished`; a listener registered with
:func:`listening` receives them. Without a listener the events only count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class StepListener:
    def plan(self, total: int, title: str) -> None: ...
    def started(self, label: str) -> None: ...
    def finished(self, label: str, cached: bool) -> None: ...
    def notice(self, text: str) -> None: ...


_listeners: list[StepListener] = []
_counts = {"executed": 0, "cached": 0}


@contextmanager
def listening(listener: StepListener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


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


def counts() -> dict[str, int]:
    return dict(_counts)
