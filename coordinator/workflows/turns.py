"""Turns per key: the changes of one workflow instance on this replica, one at a time; and
the messages of one instance handled here after those stored before them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


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


@dataclass(eq=False, slots=True)
class _Handling:
    seq: int
    done: asyncio.Event = field(default_factory=asyncio.Event)


class StoredOrder:
    """Per key, a message is handled once every message stored before it (a lower stream
    sequence) and delivered here before its turn came is handled: a cancel stored before a
    step's result is applied first, although the result needs no round trip and the cancel
    two (a restart's backlog dispatched the next step after the cancel). Enter it before any
    await, so that messages delivered together all enter before any is handled. Another
    replica's messages are not waited for."""

    def __init__(self) -> None:
        self._handling: dict[str, list[_Handling]] = {}

    @asynccontextmanager
    async def after_earlier(self, key: str, seq: int) -> AsyncIterator[None]:
        handling = self._handling.setdefault(key, [])
        mine = _Handling(seq)
        handling.append(mine)
        try:
            # Waits only ever go to lower sequences: no two handlings wait for each other.
            while earlier := [h.done for h in handling if h.seq < seq]:
                await earlier[0].wait()
            yield
        finally:
            mine.done.set()
            handling.remove(mine)
            if not handling:
                del self._handling[key]
