"""What nats-py's callbacks tell of one connection: when it went down and came back, whether
it is lost for good, and its asynchronous errors, each kind said at most once a minute."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

from nats.errors import SlowConsumerError

from agentreach.broker.client import Client
from agentreach.broker.connect_failure import FailedAttempts, refuses_credentials
from agentreach.broker.errors import ConnectionBroke
from agentreach.logs import RepeatedLines, get_logger

log = get_logger("broker")

REFUSALS_BEFORE_GIVING_UP = 3  # authorization errors in a row while reconnecting
ERROR_LINE_EVERY_S = 60.0
_NUMBERS = re.compile(r"\d+")


class Link:
    """The callbacks of one connection and what they learnt.

    While the first connect runs, errors go to ``attempts`` (they make its ConnectError);
    once ``client`` is set they are logged, and a connection lost for good sets ``lost``.
    After our own close (``client`` None again) nothing is said.
    """

    def __init__(self, shown_url: str) -> None:
        self.shown_url = shown_url
        self.attempts: FailedAttempts | None = None
        self.client: Client | None = None
        self.reconnects = 0  # how often the connection came back (views may need a grace)
        self.breaks = 0  # how often it was lost (a write may carry a decision made before)
        # When (monotonic) it last came (back) to the server: a reconnect, or the first
        # connect (see connected); 0: not yet.
        self.back_at = 0.0
        # Set once the connection is gone for good without close(): the server closed it for
        # its credentials (revoked, expired), or keeps refusing them on every reconnect.
        # Waiting will not help; a service should stop and say so.
        self.lost = asyncio.Event()
        self._back = asyncio.Event()  # set on each reconnect (see came_back)
        self.lost_why = ""
        self._down_since: float | None = None
        self._refusals = 0
        self._error_lines = RepeatedLines(ERROR_LINE_EVERY_S)
        self._last_server = ""  # the server last connected to: the one an error broke off
        # Told the subscription's subject of each message it dropped, its queue full (a flood).
        self.on_dropped: Callable[[str], None] | None = None

    def callbacks(self) -> dict[str, Any]:
        """nats-py's connect options for these callbacks."""
        return {
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "closed_cb": self._on_closed,
        }

    def connected(self, client: Client) -> None:
        """The first connect made it. It counts as coming back: a process just started
        cannot tell that the server was away a moment ago, while others are still on their
        way back (a coordinator started as the server returned took an agent's lease, lapsed
        meanwhile, for a dead agent's, and ran its steps again elsewhere: a chaos run)."""
        self.client = client
        self.back_at = time.monotonic()
        self._last_server = self.server

    @property
    def server(self) -> str:
        """The server connected to now (host:port, never credentials), or ``""``."""
        client = self.client
        uri = client.connected_url if client is not None and client.is_connected else None
        return f"{uri.hostname}:{uri.port}" if uri is not None else ""

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            if self.on_dropped is not None and exc.sub is not None:
                self.on_dropped(exc.sub.subject)
            # nats-py reads on without yielding while the socket holds data: a flood stalled
            # the event loop for 10 s at a time. Each dropped message lets the others run.
            await asyncio.sleep(0)
        if self.client is None:
            if self.attempts is not None:  # the first connect: reported as its ConnectError
                self.attempts.record(exc)
            return
        if self._down_since is not None and refuses_credentials(exc):
            self._refusals += 1
            if self._refusals == REFUSALS_BEFORE_GIVING_UP:
                self._lose("the server refuses this party's credentials (revoked or expired?)")
        said = str(exc) or type(exc).__name__
        if self._down_since is not None:
            # Already said it is down: one line per outage, not one per retry.
            log.debug("nats error", error=said)
            return
        # The same error again and again (a KV watch re-created twice a second while a
        # cluster has no majority): one line a minute, saying how often it came meanwhile.
        repeated = self._error_lines.due(f"{type(exc).__name__} {_NUMBERS.sub('#', said)}")
        # server: the one it came from (a reset comes once it is gone); url: the seed list
        where = {"server": self.server or self._last_server, "url": self.shown_url}
        if repeated is None:
            log.debug("nats error", error=said)
        elif repeated:
            log.warning("nats error", error=said, **where, times_since_last=repeated)
        else:
            log.warning("nats error", error=said, **where)

    async def _on_disconnected(self) -> None:
        # Not during the first connect: that one fails with its own error.
        if self.client is not None:
            self.breaks += 1
        if self.client is not None and self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("nats disconnected; reconnecting", url=self.shown_url)

    async def _on_reconnected(self) -> None:
        down_s = time.monotonic() - (self._down_since or time.monotonic())
        self._down_since = None
        self._refusals = 0
        self.reconnects += 1
        self.back_at = time.monotonic()
        self._last_server = self.server
        self._back.set()
        log.info("nats reconnected", server=self.server, down_s=round(down_s, 2))

    async def came_back(self, since: int) -> int:
        """Once the connection has come back more than ``since`` times (``reconnects``):
        how often it has."""
        while self.reconnects <= since:
            self._back.clear()
            await self._back.wait()
        return self.reconnects

    async def unbroken(self, since: int | None, subject: str, within_s: float) -> None:
        """Once connected (nats-py's TimeoutError when not within ``within_s``);
        ConnectionBroke when it broke after ``since`` (``breaks`` when the decision a write
        to ``subject`` carries was made; None: no decision to keep)."""
        client = self.client
        if client is not None and not client.is_connected:
            await client.connected_within(within_s)
        if since is not None and self.breaks != since:
            raise ConnectionBroke(f"{subject}: not sent: the connection broke since")

    async def _on_closed(self) -> None:
        if self.client is not None:  # not our own close()
            reason = self.client.last_error
            self._lose(f"the server closed the connection for good: {reason or 'no reason given'}")

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            log.error(why, url=self.shown_url)
            self.lost_why = why
            self.lost.set()
