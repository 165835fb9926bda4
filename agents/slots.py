"""Room in an agent: how many handlers of one priority run at once (its capacity), and how
many deliveries it holds (twice that, so the next task is in hand while one runs and the
outcome of the last is being recorded); a way to wait for either, and the handler latency
an agent advertises with its free slots."""

from __future__ import annotations

import asyncio


class WorkerPool:
    """``size`` places, taken and given back one at a time, and a way to wait for one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.size - self.busy

    async def wait_free(self) -> None:
        """Until a place is free (take it before the next await)."""
        while self.free <= 0:
            self._freed.clear()
            await self._freed.wait()

    def take(self) -> None:
        self.busy += 1

    def give(self) -> None:
        self.busy -= 1
        self._freed.set()


class LatencyEstimate:
    """A moving average of handler latency, for the capacity an ``ack`` advertises."""

    def __init__(self, weight: float = 0.2) -> None:
        self._weight = weight
        self._average: float | None = None

    @property
    def estimate_ms(self) -> int:
        return int(self._average or 0)

    def observe(self, duration_ms: int) -> None:
        if self._average is None:
            self._average = float(duration_ms)
        else:
            self._average += self._weight * (duration_ms - self._average)
