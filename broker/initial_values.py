"""When a KV watch has delivered every value present at its start.

nats-py (and our first watch) called the initial values through at the first message whose
``pending`` was 0, or at once when the consumer's info said nothing was pending and nothing
had been processed yet. Both came too early, and a coordinator replica judged an agent's card
before reading its allowance (nats-io/nats.py#842, #995):

- the info is answered beside the deliveries, so "nothing pending" may come while values are
  still on their way to the client;
- a message's ``pending`` is not monotonic: under concurrent writes one may say 0 and the next
  ones, sent at the start, say 10 and 9.

So the consumer's info at the start fixes how many deliveries the initial values are (what it
had sent plus what it had pending): they are through once that many arrived. A value removed
before its delivery (expired, purged) never arrives; then a ``pending`` of 0 with no delivery
after it for ``settle_s`` ends the wait instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

SETTLE_S = 0.5


class InitialValues:
    """Counts deliveries against the boundary; calls ``through`` once, when they are in."""

    def __init__(self, through: Callable[[], None], *, settle_s: float = SETTLE_S) -> None:
        self._through = through
        self._settle_s = settle_s
        self._boundary: int | None = None  # unknown until the consumer's info is read
        self._received = 0
        self._last_pending: int | None = None
        self._settling: asyncio.TimerHandle | None = None
        self.done = False

    def expect(self, *, sent: int, pending: int) -> None:
        """The consumer's info at the start: ``sent`` delivered already, ``pending`` to come."""
        self._boundary = sent + pending
        self._check()

    def delivered(self, pending: int) -> None:
        """One delivery (a value, a delete, a marker), with the ``pending`` it reported."""
        self._received += 1
        self._last_pending = pending
        self._check()

    def cancel(self) -> None:
        if self._settling is not None:
            self._settling.cancel()
            self._settling = None

    def _check(self) -> None:
        self.cancel()
        if self.done or self._boundary is None:
            return
        if self._received >= self._boundary:
            self._finish()
        elif self._last_pending == 0:  # short of the boundary: some may have been removed
            self._settling = asyncio.get_running_loop().call_later(self._settle_s, self._finish)

    def _finish(self) -> None:
        self._settling = None
        if not self.done:
            self.done = True
            self._through()
