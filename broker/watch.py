"""Watching a KV bucket as a plain async iterator of changes (no sentinel values)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from agentreach.broker.errors import translated


@dataclass(frozen=True, slots=True)
class Change:
    """A key's new value, or ``value=None`` when it was deleted or purged."""

    key: str
    value: bytes | None
    revision: int
    written_ms: int = 0  # the broker's time of the write


class BucketWatch:
    """Every key's latest value, then each change as it happens.

    ``initial`` is set once the values present at the start were delivered.

        async with BucketWatch(kv) as watch:
            async for change in watch:
                ...
    """

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._watcher: KeyValue.KeyWatcher | None = None
        self.initial = asyncio.Event()

    async def __aenter__(self) -> Self:
        with translated():
            self._watcher = await self._kv.watchall()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            with contextlib.suppress(Exception):  # closing: the subscription may be gone already
                await watcher.stop()

    def __aiter__(self) -> AsyncIterator[Change]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[Change]:
        assert self._watcher is not None, "use `async with BucketWatch(...)`"
        async for entry in self._watcher:
            if entry is None:  # nats-py's "initial values delivered" marker
                self.initial.set()
                continue
            yield _change(entry)
            if entry.delta == 0:
                self.initial.set()

    async def snapshot(self) -> list[Change]:
        """The values present when the watch began (deleted keys left out), then stop."""
        assert self._watcher is not None, "use `async with BucketWatch(...)`"
        found: list[Change] = []
        async for entry in self._watcher:
            if entry is None:
                break
            if (change := _change(entry)).value is not None:
                found.append(change)
            if entry.delta == 0:
                break
        self.initial.set()
        return found


async def snapshot(kv: KeyValue) -> list[Change]:
    """Every key's current value, read through one watch rather than a request per key.

    Raises only :class:`~agentreach.broker.errors.BrokerError`.
    """
    async with BucketWatch(kv) as watch:
        with translated():
            return await watch.snapshot()


def _change(entry: KeyValue.Entry) -> Change:
    deleted = entry.operation in (KV_DEL, KV_PURGE)
    return Change(
        key=entry.key,
        value=None if deleted else entry.value,
        revision=entry.revision or 0,
        written_ms=int(entry.created.timestamp() * 1000) if entry.created else 0,
    )
