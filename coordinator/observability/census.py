"""Views of KV buckets that the metrics and the dashboard read, kept current by watches:
workflow instances in flight (decoding only what is shown), breaker records (read only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

import msgspec
import structlog

from agentreach.broker import Broker, BucketWatch
from agentreach.broker.errors import honour_cancellation
from agentreach.envelopes import BreakerRecord, DecodeError, decode_as

log = structlog.get_logger("coordinator.census")

Apply = Callable[[str, bytes | None], None]

IN_FLIGHT = ("running", "compensating")


class _StepState(msgspec.Struct):
    status: str = "waiting"


class InFlight(msgspec.Struct, kw_only=True):
    """The parts of a ``WorkflowRecord`` a census keeps (the rest is never decoded)."""

    instance_id: str
    workflow: str
    trace_id: str = ""
    status: Literal["running", "compensating", "completed", "failed", "cancelled"] = "running"
    started_ms: int = 0
    deadline_ms: int = 0
    current: str | None = None
    steps: dict[str, _StepState] = {}
    steps_total: int = 0
    compensations: dict[str, _StepState] = {}

    @property
    def steps_done(self) -> int:
        return sum(s.status == "completed" for s in self.steps.values())

    @property
    def running(self) -> list[str]:
        steps = [k for k, s in self.steps.items() if s.status == "running"]
        return steps + [f"undo {k}" for k, s in self.compensations.items() if s.status == "running"]


async def _follow(
    broker: Broker, bucket: str, apply: Apply, ready: asyncio.Event | None = None
) -> None:
    kv = await broker.kv(bucket)
    seal = broker.record_seals.get(bucket)
    async with BucketWatch(kv, headed=bucket in broker.headed_buckets) as watch:
        waiter = asyncio.create_task(_set_when(watch.initial, ready))
        try:
            async for change in watch:
                subject = f"$KV.{bucket}.{change.key}"
                if seal is None or seal.holds(subject, change.value or b"", change.headers):
                    apply(change.key, change.value)
                else:  # what no replica wrote (a server's answer aimed at the key)
                    log.debug("record left out", bucket=bucket, key=change.key)
                honour_cancellation()
        finally:
            waiter.cancel()


async def _set_when(initial: asyncio.Event, ready: asyncio.Event | None) -> None:
    await initial.wait()
    if ready is not None:
        ready.set()


class WorkflowCensus:
    """Workflow instances in flight, from a watch of ``reach_workflows``."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.in_flight: dict[str, InFlight] = {}
        self.loaded = False

    async def follow(self, ready: asyncio.Event | None = None) -> None:
        """Keep current until cancelled; ``ready`` is set once the present values are in."""
        ready = ready or asyncio.Event()
        loaded = asyncio.create_task(self._loaded(ready))
        try:
            await _follow(self._broker, self._broker.names.workflows_bucket, self._apply, ready)
        finally:
            loaded.cancel()

    async def _loaded(self, ready: asyncio.Event) -> None:
        await ready.wait()
        self.loaded = True

    def _apply(self, key: str, value: bytes | None) -> None:
        if value is None:
            self.in_flight.pop(key, None)
            return
        try:
            record = decode_as(value, InFlight)
        except DecodeError as exc:
            log.debug("unreadable workflow record", instance_id=key, error=str(exc))
            return
        if record.status in IN_FLIGHT:
            self.in_flight[key] = record
        else:
            self.in_flight.pop(key, None)

    def by_status(self) -> dict[tuple[str, str], int]:
        """``{(workflow, status): count}`` of the instances in flight."""
        counts: dict[tuple[str, str], int] = {}
        for record in self.in_flight.values():
            key = (record.workflow, record.status)
            counts[key] = counts.get(key, 0) + 1
        return counts


class BreakerView:
    """Every breaker and isolation record, read only (the coordinator's BreakerBoard also
    writes transitions; a dashboard must not)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.records: dict[str, BreakerRecord] = {}

    async def follow(self, ready: asyncio.Event | None = None) -> None:
        await _follow(self._broker, self._broker.names.breakers_bucket, self._apply, ready)

    def _apply(self, key: str, value: bytes | None) -> None:
        if value is None:
            self.records.pop(key, None)
            return
        try:
            self.records[key] = decode_as(value, BreakerRecord)
        except DecodeError:
            self.records.pop(key, None)

    @property
    def isolated(self) -> list[str]:
        return sorted(
            r.agent_id for r in self.records.values() if not r.intent and r.state != "closed"
        )
