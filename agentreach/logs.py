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

from typing import Any

import structlog

# The methods below WARNING, and their async forms (``msg`` is info's other name).
_QUIET = frozenset({"debug", "info", "msg", "adebug", "ainfo", "amsg"})


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
