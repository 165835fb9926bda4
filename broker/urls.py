"""Where NATS is: a URL or a comma-separated seed list, from the option or ``$NATS_URL``, and
how it may be shown (never with its password or token)."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

DEFAULT_URL = "nats://127.0.0.1:4222"
_CREDENTIALS = re.compile(r"(?<=://)[^@/]*@")


def resolve_url(url: str | None = None) -> str:
    """The URL(s) to use: the one given, else ``$NATS_URL``, else the local default."""
    return url or os.environ.get("NATS_URL") or DEFAULT_URL


def server_list(url: str) -> list[str]:
    """``nats://a:4222,nats://b:4222`` → each server; a bare ``host:port`` gets ``nats://``."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    return [s if "://" in s else f"nats://{s}" for s in servers] or [DEFAULT_URL]


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
