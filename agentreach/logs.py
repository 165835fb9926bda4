"""The library's loggers: quiet below WARNING until the application configures structlog.

structlog, never configured, prints every level; Python's own logging, never configured,
shows warnings and errors only, which is what a program that imports a library expects. A
script that used a ``ReachClient`` printed sixteen ``[debug] nats error`` lines during one
server restart. So the SDK's loggers (``agentreach.agents``, ``agentreach.broker``) drop
debug and info lines while ``structlog.is_configured()`` is False, and pass every line on
once the application configured structlog (``reach`` does, in ``agentreach.cli.logs``):
its configuration then decides what is shown. Checked at each call, so configuring after
import works.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import structlog

# The methods below WARNING, and their async forms (``msg`` is info's other name).
_QUIET = frozenset({"debug", "info", "msg", "adebug", "ainfo", "amsg"})
_KINDS_REMEMBERED = 64


def get_logger(name: str) -> Any:
    """The logger of one of the SDK's modules (typed as structlog's own: ``Any``)."""
    return LibraryLogger(structlog.get_logger(name))


class LibraryLogger:
    """A structlog logger that says nothing below WARNING while structlog is unconfigured."""

    __slots__ = ("_logger",)

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def bind(self, **values: Any) -> LibraryLogger:
        return LibraryLogger(self._logger.bind(**values))

    def new(self, **values: Any) -> LibraryLogger:
        return LibraryLogger(self._logger.new(**values))

    def __getattr__(self, method: str) -> Any:
        if method in _QUIET and not structlog.is_configured():
            return _anothing if method.startswith("a") else _nothing
        return getattr(self._logger, method)


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


async def _anothing(*args: Any, **kwargs: Any) -> None:
    return None


class RepeatedLines:
    """Which log lines are due: a kind of line at most ``burst`` times per ``every_s``, so
    that what anyone can make happen again and again (copies aimed at a bucket, forged
    advisories) cannot make a log grow at its pace. The kinds remembered are bounded too."""

    def __init__(self, every_s: float, *, burst: int = 1) -> None:
        self._every_s = every_s
        self._burst = burst
        # kind -> (when its window opened, lines said in it, times it came unsaid since)
        self._kinds: OrderedDict[str, tuple[float, int, int]] = OrderedDict()

    def due(self, kind: str) -> int | None:
        """None when ``burst`` lines of ``kind`` were said less than ``every_s`` ago; else
        how many times it came unsaid since the last line (0 the first time)."""
        now = time.monotonic()
        opened, said, unsaid = self._kinds.get(kind, (float("-inf"), 0, 0))
        if now - opened >= self._every_s:
            opened, said = now, 0
        if said >= self._burst:
            self._kinds[kind] = (opened, said, unsaid + 1)
            return None
        self._kinds[kind] = (opened, said + 1, 0)
        self._kinds.move_to_end(kind)
        while len(self._kinds) > _KINDS_REMEMBERED:
            self._kinds.popitem(last=False)
        return unsaid


class FirstTimes:
    """Which things come for the first time: a thing said once is not said again (the
    ``size`` things seen last are remembered, so a long-lived process stays bounded)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._seen: OrderedDict[Hashable, None] = OrderedDict()

    def first(self, thing: Hashable) -> bool:
        """True the first time ``thing`` comes (within the last ``size``), then False."""
        if thing in self._seen:
            self._seen.move_to_end(thing)
            return False
        self._seen[thing] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return True
