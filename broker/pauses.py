"""How a pause of something that reads from NATS (a consumer, a stream followed, a poll) is
said: a warning when it begins while the connection is up. While the connection is down the
failure is the outage's, which the connection says once ("nats disconnected", then "nats
reconnected" with its length): a debug line, and a warning only if the pause outlasts the
outage by :data:`STILL_PAUSED_S`. Each consumer said every outage, and its end: a dozen lines
for one 5 s outage (an outside trial)."""

from __future__ import annotations

import time

from agentreach.broker.connection import Broker
from agentreach.logs import get_logger

log = get_logger("broker")

STILL_PAUSED_S = 10.0  # JetStream may take a few seconds to answer after a restart


class Pause:
    """One reader's pause: ``failed`` at each failure, ``ended`` at each success."""

    def __init__(self, broker: Broker, paused: str, again: str, **about: object) -> None:
        self._broker = broker
        self._paused, self._again, self._about = paused, again, about
        self._since: float | None = None
        self._loud = False  # said as a warning

    @property
    def on(self) -> bool:
        """Whether it is paused (failed, and not read again since)."""
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since, self._loud = now, self._broker.connected
            said = log.warning if self._loud else log.debug
            said(self._paused, error=str(exc), **self._about)
        elif not self._loud and self._outlasted_outage(now):
            self._loud = True
            log.warning(
                f"{self._paused} (still, {STILL_PAUSED_S:g} s after the connection came back)",
                error=str(exc),
                paused_s=round(now - self._since, 1),
                **self._about,
            )

    def ended(self) -> None:
        if self._since is None:
            return
        paused_s = round(time.monotonic() - self._since, 1)
        (log.info if self._loud else log.debug)(self._again, paused_s=paused_s, **self._about)
        self._since = None

    def _outlasted_outage(self, now: float) -> bool:
        link = self._broker.link
        return self._broker.connected and now - link.back_at >= STILL_PAUSED_S
