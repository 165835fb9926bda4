"""A duty that must run once across coordinator replicas, held under a KV lease.

The lease is a record in ``reach_leases``: who holds it and until when. The
holder renews it every third of its length with a conditional write; anyone may
take it once it has lapsed. Losing a renewal stops the duty at once, so two
replicas never run it together for longer than one renewal race.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import msgspec
import nats.errors
import nats.js.errors
import structlog
from agentreach.broker import Broker
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.tasks import cancel_and_wait

from agentreach import envelopes

log = structlog.get_logger("coordinator.lease")


class LeaseRecord(msgspec.Struct, frozen=True):
    holder: str
    until_ms: int


_decoder = msgspec.json.Decoder(LeaseRecord)


class Lease:
    """Runs ``duty`` only while this replica holds the lease called ``name``."""

    def __init__(self, broker: Broker, name: str, holder: str, *, ttl_s: float) -> None:
        self._broker = broker
        self._name = name
        self._holder = holder
        self._ttl_s = ttl_s
        self._revision: int | None = None
        self.held = False

    async def hold(self, duty: Callable[[], Awaitable[None]]) -> None:
        """Until cancelled: take or renew the lease, run the duty while it is ours."""
        running: asyncio.Task[None] | None = None
        try:
            while True:
                self.held = await self._take_or_renew()
                honour_cancellation()
                if self.held and running is None:
                    log.info("lease taken", lease=self._name, holder=self._holder)
                    running = asyncio.create_task(duty(), name=f"lease-{self._name}")
                elif not self.held and running is not None:
                    log.warning("lease lost; duty stopped", lease=self._name)
                    await _stop(running)
                    running = None
                if running is not None and running.done():
                    running.result()  # the duty failed: let the service see it
                await asyncio.sleep(self._ttl_s / 3)  # the renewal period
        finally:
            if running is not None:
                await _stop(running)
            if self.held:
                await self._release()

    async def _take_or_renew(self) -> bool:
        kv = await self._broker.kv(self._broker.names.leases_bucket)
        now = int(time.time() * 1000)
        mine = envelopes.encode(LeaseRecord(self._holder, now + int(self._ttl_s * 1000)))
        try:
            entry = await kv.get(self._name)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            entry = None
        except nats.errors.Error as exc:
            log.warning("lease unreadable", lease=self._name, error=str(exc))
            return False
        try:
            if entry is None:
                self._revision = await kv.create(self._name, mine)
                return True
            current = _decoder.decode(entry.value or b"")
            if current.holder != self._holder and current.until_ms > now:
                return False
            self._revision = await kv.update(self._name, mine, last=entry.revision)
            return True
        except (nats.errors.Error, msgspec.DecodeError):
            return False  # someone else wrote first, or the record is not ours to read

    async def _release(self) -> None:
        kv = await self._broker.kv(self._broker.names.leases_bucket)
        with contextlib.suppress(Exception):
            await kv.delete(self._name, last=self._revision)


async def _stop(task: asyncio.Task[None]) -> None:
    await cancel_and_wait(task)
