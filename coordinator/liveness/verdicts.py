"""Liveness verdicts written behind the judge, so judging never waits on a write.

A fleet that starts at once makes as many ONLINE transitions as it has agents, each a
verdict in KV and an ``agent_state`` event: written one by one in the heartbeat loop,
100,000 agents put the loop minutes behind their heartbeats, and live agents were judged
SUSPECT. Here the judge only queues; a writer publishes in batches. A newer verdict of an
agent replaces its older one not yet written (KV keeps only the latest anyway), and
events go out in the order they were queued.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import structlog

from agentreach.broker import Broker, BrokerError, BrokerTimeout, NoResponders, NoStreamError
from agentreach.broker.errors import Unavailable
from agentreach.broker.lifecycle import event_message
from agentreach.envelopes import Event, Liveness

log = structlog.get_logger("coordinator.liveness")

BATCH = 256  # writes in flight at once
TRIES = 3  # per write while connected, unless JetStream just cannot answer now
# JetStream cannot answer now (a stream without a leader, a cluster without a majority):
# tried until it can. A verdict given up left an agent SUSPECT in KV, and unrouted by
# every replica, for 6 minutes after a quorum loss: the judge saw no transition to write
# again while its heartbeats came steadily.
NOT_NOW = (NoStreamError, NoResponders, Unavailable, BrokerTimeout)
RETRY_PAUSE_S = 0.5
FINAL_FLUSH_S = 2.0  # what a stopping writer spends on what is still queued


class VerdictWriter:
    """Queues each transition's verdict and event; :meth:`run` writes them."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._records: dict[str, tuple[Liveness, int]] = {}  # agent id → newest, tries so far
        self._events: deque[tuple[Event, int]] = deque()
        self._wake = asyncio.Event()
        self._queued = 0  # transitions queued so far
        self._written = 0  # of those, how many are through (written or given up)
        self._progress = asyncio.Condition()

    def put(self, record: Liveness, event: Event | None) -> None:
        """Queue ``record`` (and the transition's ``event``; None to write the verdict
        again, with no transition: the bucket was made again, empty)."""
        self._records.pop(record.agent_id, None)  # re-inserted last: written in queue order
        self._records[record.agent_id] = (record, 0)
        if event is not None:
            self._events.append((event, 0))
        self._queued += 1
        self._wake.set()

    async def forget(self) -> None:
        """Drop what an earlier term of the liveness duty left unwritten: the next term
        judges from what the bucket holds. Written after its restore, a lost term's SUSPECT
        verdicts left every agent SUSPECT in KV while the judge held them ONLINE, and no
        heartbeat made a transition to write again (a quorum loss, until a restart)."""
        if self._records or self._events:
            log.info("verdicts of an earlier term dropped", verdicts=len(self._records))
        self._records.clear()
        self._events.clear()
        async with self._progress:
            self._written = self._queued
            self._progress.notify_all()

    async def written(self, timeout_s: float) -> bool:
        """Wait until every transition queued so far is through; False after ``timeout_s``."""
        target = self._queued
        # asyncio.timeout, not wait_for: wait_for runs the wait in a task of its own, which,
        # cancelled after its caller gave up, takes the condition's lock back and ends holding
        # it; every later wait then hangs, and so does the liveness duty's shutdown.
        try:
            async with asyncio.timeout(timeout_s), self._progress:
                await self._progress.wait_for(lambda: self._written >= target)
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._drain()
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._drain(), FINAL_FLUSH_S)

    async def _drain(self) -> None:
        while self._records or self._events:
            target = self._queued
            records = [self._records.pop(key) for key in list(self._records)[:BATCH]]
            events = [self._events.popleft() for _ in range(min(BATCH, len(self._events)))]
            took_all = not self._records and not self._events
            if not await self._write(records, events):
                await asyncio.sleep(RETRY_PAUSE_S)  # failures: the server may be away
            elif took_all:
                async with self._progress:
                    self._written = target
                    self._progress.notify_all()

    async def _write(
        self, records: list[tuple[Liveness, int]], events: list[tuple[Event, int]]
    ) -> bool:
        """Write verdicts and events at once; False when any must be tried again."""
        verdicts = await self._broker.bucket(self._broker.names.liveness_bucket, Liveness)
        try:
            results = await self._broker.publish_all(
                [verdicts.put_message(record.agent_id, record) for record, _ in records]
                + [event_message(self._broker, event) for event, _ in events]
            )
        except BrokerError as exc:  # not even sent: the connection is away
            results = [exc] * (len(records) + len(events))
        retry = False
        for (record, tries), result in zip(records, results[: len(records)], strict=True):
            newer = record.agent_id in self._records  # queued while this one was written
            if self._failed(result, tries, record.agent_id) and not newer:
                self._records[record.agent_id] = (record, tries + 1)
                retry = True
        failed_events = [
            (event, tries + 1)
            for (event, tries), result in zip(events, results[len(records) :], strict=True)
            if self._failed(result, tries, event.agent_id)
        ]
        self._events.extendleft(reversed(failed_events))  # ahead of newer ones, in order
        return not retry and not failed_events

    def _failed(self, result: object, tries: int, agent_id: str | None) -> bool:
        """Whether a write's ``result`` asks for another try."""
        if not isinstance(result, BaseException):
            return False
        if not isinstance(result, BrokerError):
            log.error("liveness verdict or event not written", agent_id=agent_id, exc_info=result)
            return False
        if not self._broker.connected or tries + 1 < TRIES:
            return True
        if isinstance(result, NOT_NOW):
            if tries + 1 == TRIES:
                log.warning(
                    "liveness verdict or event not written yet; trying until JetStream answers",
                    agent_id=agent_id,
                    error=str(result),
                )
            return True
        log.warning("liveness verdict or event not written", agent_id=agent_id, error=str(result))
        return False
