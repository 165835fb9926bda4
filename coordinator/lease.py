"""A duty that must run once across coordinator replicas, held under a KV lease.

The lease is a record in ``reach_leases``: who holds it and until when. The
holder renews it every third of its length with a conditional write; anyone may
take it once it has lapsed. Losing a renewal stops the duty at once, so two
replicas never run it together for longer than one renewal race.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from agentreach.broker import Broker, BrokerError, Bucket, WrongLastSequence
from agentreach.broker.errors import honour_cancellation, pause
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes import LeaseRecord, now_ms

log = structlog.get_logger("coordinator.lease")

RENEW_TRIES = 5
# Releasing is a courtesy (another replica takes a lapsed lease after its ttl): a stop does
# not wait through a leader election for it (it took 9 s with a node stopped).
RELEASE_WAIT_S = 1.0


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
                    await cancel_and_wait(running)
                    running = None
                if running is not None and running.done():
                    running.result()  # the duty failed: let the service see it
                await pause(self._ttl_s / 3)  # the renewal period
        finally:
            if running is not None:
                await cancel_and_wait(running)
            if self.held:
                await self._release()

    async def _take_or_renew(self) -> bool:
        now = now_ms()
        mine = LeaseRecord(self._holder, now + int(self._ttl_s * 1000))

        def take(current: LeaseRecord | None) -> LeaseRecord | None:
            if current is not None and current.holder != self._holder and current.until_ms > now:
                return None  # someone else's, and still valid
            return mine

        try:
            # A few tries: what anyone may have the server write onto the key (a flood of
            # its answers, aimed there) changes it under us too, and a lost renewal stops
            # the duty; a replica's own write there is judged again by `take`.
            swap = await (await self._leases()).cas(self._name, take, tries=RENEW_TRIES)
        except WrongLastSequence:
            return False  # someone else wrote first, every time
        except BrokerError as exc:
            log.warning("lease unreadable", lease=self._name, error=str(exc))
            return False
        if swap.written and swap.entry is not None:
            self._revision = swap.entry.revision
        return swap.written

    async def _release(self) -> None:
        with contextlib.suppress(BrokerError, TimeoutError):
            async with asyncio.timeout(RELEASE_WAIT_S):
                await (await self._leases()).delete(self._name, last=self._revision)

    async def _leases(self) -> Bucket[LeaseRecord]:
        return await self._broker.bucket(self._broker.names.leases_bucket, LeaseRecord)
