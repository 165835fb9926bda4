"""The coordinator's HTTP endpoint: ``/metrics`` for Prometheus, ``/healthz`` (the process
answers) and ``/readyz`` (connected, provisioned, consuming) for probes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from agentreach.broker import Broker, Delivery, PullConsumer
from agentreach.coordinator.observability.flow import FlowMetrics
from agentreach.coordinator.observability.http import Request, Response


@dataclass
class Readiness:
    """Whether this replica can do its work now, and if not, why."""

    broker: Broker
    provisioned: bool = False
    serving: bool = False  # every loop bound and every view loaded
    consumers: Sequence[PullConsumer] = field(default_factory=list)
    scrapeable: bool = False  # /metrics is served
    scraped: asyncio.Event = field(default_factory=asyncio.Event)  # it was read once

    def why_not(self) -> str | None:
        if not self.broker.connected:
            return "not connected to NATS"
        if not self.provisioned:
            return "streams and buckets not provisioned yet"
        if not self.serving:
            return "starting: views loading, consumers binding"
        failing = [c.spec.durable for c in self.consumers if c.failing]
        if failing:
            return f"consumers paused: {', '.join(failing)}"
        return None

    @property
    def ready(self) -> bool:
        return self.why_not() is None


SCRAPE_FRESH_S = 1.0  # a scrape this soon after the last is answered with its text


class _Scrapes:
    """The text of ``/metrics``, collected at most once per :data:`SCRAPE_FRESH_S`: scrapes
    back to back (anyone who reaches the port may make them) each read every series on the
    event loop, and two clients doing so slowed honest calls from 29 to 714 ms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._lock = asyncio.Lock()
        self._text, self._at, self._fresh_s = b"", float("-inf"), SCRAPE_FRESH_S

    async def text(self) -> bytes:
        async with self._lock:
            loop = asyncio.get_running_loop()
            if loop.time() - self._at >= self._fresh_s:
                began = loop.time()
                # Read on the event loop, like every view it reads (no dict changes under
                # it); written out in a thread: the text of a few thousand series takes
                # twice as long as reading them (20 topics: ~11 ms, then ~20 ms).
                collected = _Collected(list(self._registry.collect()))
                self._text = await asyncio.to_thread(generate_latest, collected)  # type: ignore[arg-type]
                self._at = loop.time()
                # Never more than half the loop's time, however long a collection takes.
                self._fresh_s = max(SCRAPE_FRESH_S, 2 * (self._at - began))
            return self._text


def endpoint(registry: CollectorRegistry, readiness: Readiness) -> Callable[..., object]:
    """The request handler: ``/metrics``, ``/healthz``, ``/readyz``."""
    scrapes = _Scrapes(registry)

    async def handle(request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response.error(405, "only GET is served here")
        match request.path:
            case "/metrics":
                text = await scrapes.text()
                readiness.scraped.set()
                return Response(200, text, CONTENT_TYPE_LATEST)
            case "/healthz":
                return Response(200, b"ok\n")
            case "/readyz":
                why = readiness.why_not()
                if why is None:
                    return Response(200, b"ready\n")
                return Response(503, f"not ready: {why}\n".encode())
            case "/":
                text = "Agent-Reach coordinator: /metrics, /healthz, /readyz\n"
                return Response(200, text.encode())
            case _:
                return Response.error(404, f"no {request.path} here: /metrics, /healthz, /readyz")

    return handle


@dataclass(frozen=True)
class _Collected:
    """Metrics already collected, as ``generate_latest`` reads a registry."""

    metrics: list[Metric]

    def collect(self) -> list[Metric]:
        return self.metrics


# Prometheus scrapes every 15 s to 1 min: counting waits at most this long for its first.
FIRST_SCRAPE_WAIT_S = 60.0


@dataclass
class AfterFirstScrape:
    """The counters' fold (:class:`~agentreach.coordinator.observability.flow.FlowMetrics`),
    which starts counting, after a start, once ``/metrics`` was read (at most
    FIRST_SCRAPE_WAIT_S): Prometheus must see the restarted counters at 0. A backlog
    counted before its first scrape read as no reset, and ``increase()`` lost what the
    replica had counted before (an outside trial: 120 then 130 read as +10 where 30 ended)."""

    counter: FlowMetrics
    readiness: Readiness

    async def look_up(self, deliveries: Sequence[Delivery]) -> None:
        await self.counter.routes.look_up(self.readiness.broker, deliveries)

    def count(self, delivery: Delivery) -> None:
        self.counter.count(delivery)

    def caught_up(self) -> None:
        self.counter.caught_up()

    async def ready(self) -> None:
        if self.readiness.scrapeable:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.readiness.scraped.wait(), FIRST_SCRAPE_WAIT_S)
