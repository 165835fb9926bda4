"""The access token the tests' dashboards ask for, and how a client sends it."""

from __future__ import annotations

import secrets

from agentreach.coordinator.observability import HttpServer

TOKEN = secrets.token_urlsafe(24)
BEARER = f"Authorization: Bearer {TOKEN}"


def login_url(server: HttpServer, token: str = TOKEN) -> str:
    """The URL `reach dashboard` prints at start: the page, with the token to trade for a cookie."""
    return f"{server.url}?token={token}"
