"""Where NATS is: a URL or a comma-separated seed list, from the option or ``$NATS_URL``, and
how it may be shown (never with its password or token)."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Server

from agentreach.broker.errors import ConnectError

DEFAULT_URL = "nats://127.0.0.1:4222"
_ANY_CREDENTIALS = re.compile(r"[^/@]*@")  # in an entry too malformed to be parsed
SCHEMES = ("nats", "tls", "ws", "wss")
RECONNECT_FIRST_S = 0.25
# nats-server's clients wait 2 s between reconnects by default; a longer cap held every agent
# of a restarted server up to 5 s after it was back (4.1 s measured after a 6 s outage).
RECONNECT_CAP_S = 2.0


def resolve_url(url: str | None = None) -> str:
    """The URL(s) to use: the one given, else ``$NATS_URL``, else the local default."""
    return url or os.environ.get("NATS_URL") or DEFAULT_URL


def server_list(url: str) -> list[str]:
    """``nats://a:4222,nats://b:4222`` → each server; a bare ``host:port`` gets ``nats://``.

    Raises :class:`ConnectError` naming an entry that is not a server URL, as it was typed.
    """
    typed = [part.strip() for part in url.split(",") if part.strip()]
    for entry in typed:
        if not _well_formed(_with_scheme(entry)):
            raise ConnectError(
                f"{_shown(entry)!r} is not a NATS server URL (expected nats://host:port;"
                " several are separated by commas)"
            )
    return [_with_scheme(entry) for entry in typed] or [DEFAULT_URL]


def _with_scheme(entry: str) -> str:
    return entry if "://" in entry else f"nats://{entry}"


def _well_formed(server: str) -> bool:
    parts = urlsplit(server)
    try:
        port = parts.port
    except ValueError:
        port = -1
    return (
        parts.scheme in SCHEMES and bool(parts.hostname) and port != -1 and parts.path in ("", "/")
    )


def _shown(entry: str) -> str:
    """A malformed entry as typed, its password or token hidden however it is malformed."""
    if "://" in entry and "@" in urlsplit(entry).netloc:
        return _redact_one(entry)
    return _ANY_CREDENTIALS.sub("***@", entry)


Reconnect = Callable[[list[Server], dict[str, Any]], tuple[Server | None, float]]


def jittered_reconnect(
    first_s: float = RECONNECT_FIRST_S, cap_s: float = RECONNECT_CAP_S
) -> Reconnect:
    """nats-py's ``reconnect_to_server_handler``: which server to try next, and after how long.

    One of the servers that failed least since they last answered, so that every seed is
    tried before any twice; after a random pause up to ``first_s`` doubled per round of
    failures (capped at ``cap_s``), so that a fleet whose server died does not come back in
    step. (Choosing no server would make nats-py try the first one of the pool every time.)
    """

    def choose(servers: list[Server], server_info: dict[str, Any]) -> tuple[Server | None, float]:
        if not servers:
            return None, first_s
        fewest = min(server.reconnects for server in servers)
        pick = random.choice([server for server in servers if server.reconnects == fewest])
        return pick, random.uniform(0, min(cap_s, first_s * 2**fewest))

    return choose


def redacted(url: str) -> str:
    """The URL(s) with any user's password or token replaced by ``***``, for logs and errors."""
    return ",".join(_redact_one(part) for part in url.split(","))


def _redact_one(url: str) -> str:
    parts = urlsplit(url.strip())
    if "@" not in parts.netloc:
        return url.strip()
    userinfo, _, host = parts.netloc.rpartition("@")
    user, has_password, _ = userinfo.partition(":")
    shown = f"{user}:***" if has_password else "***"
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))
