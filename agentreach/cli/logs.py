"""One place that configures structlog for every ``reach`` command."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any

import structlog

from agentreach.cli.terminal import shown

SECRET_KEYS = frozenset({"password", "token", "seed", "nkey", "creds", "jwt", "secret"})
# user:password@ or token@ inside a URL (nats://, tls://, ws://, …)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/@\s,]+)@")


def redact_secrets(
    logger: Any, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """A second net under the code's own care: values of secret-named keys become ``***``,
    and credentials inside URLs are cut from every string value."""
    for key, value in event.items():
        if key.lower() in SECRET_KEYS and value is not None:
            event[key] = "***"
        elif isinstance(value, str) and "@" in value:
            event[key] = _URL_CREDENTIALS.sub(_hide_userinfo, value)
    return event


def _hide_userinfo(match: re.Match[str]) -> str:
    user, has_password, _ = match["userinfo"].partition(":")
    return f"{match['scheme']}{user}:***@" if has_password else f"{match['scheme']}***@"


def shown_values(
    logger: Any, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Every string of a console line with its control characters escaped (see
    :mod:`agentreach.cli.terminal`): a subject token may hold any byte but whitespace, and an
    agent's or a caller's, logged, set the operator's window title, wrote the clipboard and
    erased the line above. The renderer quotes a value only for a space, `=` or a quote."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = shown(value)  # a line break: the renderer quotes the value
    return event


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Console lines in a terminal, JSON lines elsewhere (``fmt`` = auto, console, json)."""
    # asyncio's child watcher reports a subprocess that exits at once (a nats-server on a
    # taken port) as "Unknown child process"; the CLI says what happened in its own words.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    global _json_lines
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    _json_lines = fmt == "json"
    renderer: structlog.typing.Processor = (
        # Colours only for a terminal: in a file (`--log-format console > log`) they were
        # escape codes around every word.
        structlog.dev.ConsoleRenderer(colors=_colours())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            redact_secrets,
            *([shown_values] if fmt == "console" else []),  # JSON escapes them itself
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


_json_lines = False  # as configure_logging chose: JSON lines, or lines for a person


def say(text: str) -> None:
    """One line on stderr for whoever runs the command (``reach: …``); among JSON log lines,
    a JSON line itself, which a log collector reads like the others."""
    if _json_lines:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        line = json.dumps({"event": text, "level": "info", "timestamp": stamp})
    else:
        line = f"reach: {text}"
    print(line, file=sys.stderr, flush=True)


def _colours() -> bool:
    """Whether console lines are coloured: on a terminal, unless NO_COLOR is set."""
    return sys.stderr.isatty() and not os.environ.get("NO_COLOR")
