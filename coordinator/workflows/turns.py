"""Turns per key: the changes of one workflow instance on this replica, one at a time."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Turns:
    """One piece of work per key at a time, first come, first served (asyncio's locks serve
    their waiters in order); a key's lock is dropped once nobody waits for it."""

    def __init__(self) -> None:
        self._turns: dict[str, asyncio.Lock] = {}
        self._waiting: Counter[str] = Counter()

    @asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        self._waiting[key] += 1
        try:
            async with self._turns.setdefault(key, asyncio.Lock()):
                yield
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key], self._turns[key]
