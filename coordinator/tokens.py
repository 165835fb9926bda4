"""A token bucket: ``capacity`` tokens of burst, refilled at ``rate`` per second."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._at = clock()

    def take(self) -> float:
        """Take a token: 0.0 when granted, else the seconds until one will be there."""
        wait = self.wait()
        if wait == 0.0:
            self._tokens -= 1
        return wait

    def wait(self) -> float:
        """Seconds until a token is there (0.0: now), taking nothing."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate
