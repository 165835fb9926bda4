"""What the coordinator tells about itself: Prometheus metrics (flow counted once across
replicas, state computed from the views), health and readiness, and audit records.

- :mod:`.flow`: counters and histograms (:mod:`.families`), fed by the ``coordinator-metrics``
  consumer, their series created at 0 by :mod:`.priming`;
- :mod:`.state`: gauges computed at scrape time; :mod:`.census`: views they read;
- :mod:`.endpoint` on :mod:`.http`: ``/metrics``, ``/healthz``, ``/readyz``;
- :mod:`.audit`: one record per finished message in ``REACH_AUDIT``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from agentreach.coordinator.observability.audit import TERMINAL, AuditWriter
from agentreach.coordinator.observability.census import BreakerView, WorkflowCensus
from agentreach.coordinator.observability.config import (
    AuditConfig,
    ClaimCheckConfig,
    MetricsConfig,
)
from agentreach.coordinator.observability.endpoint import AfterFirstScrape, Readiness, endpoint
from agentreach.coordinator.observability.flow import FlowMetrics
from agentreach.coordinator.observability.http import HttpServer
from agentreach.coordinator.observability.labels import FOLDED, QUOTA_ANSWERS, AgentTopics
from agentreach.coordinator.observability.open_letters import OpenLetters
from agentreach.coordinator.observability.state import Sampled, StateCollector, Views

__all__ = [
    "FOLDED",
    "QUOTA_ANSWERS",
    "TERMINAL",
    "AfterFirstScrape",
    "AgentTopics",
    "AuditConfig",
    "AuditWriter",
    "BreakerView",
    "ClaimCheckConfig",
    "FlowMetrics",
    "HttpServer",
    "MetricsConfig",
    "OpenLetters",
    "Readiness",
    "Sampled",
    "StateCollector",
    "Views",
    "WorkflowCensus",
    "new_registry",
    "serving",
]


def new_registry() -> CollectorRegistry:
    """A registry of this replica's own, with the process and Python collectors."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@contextlib.asynccontextmanager
async def serving(
    config: MetricsConfig, registry: CollectorRegistry, readiness: Readiness
) -> AsyncIterator[HttpServer | None]:
    """The HTTP endpoint for the block, when ``config.port`` is set."""
    if config.port is None:
        yield None
        return
    handler = endpoint(registry, readiness)
    readiness.scrapeable = True
    async with HttpServer(
        handler,  # type: ignore[arg-type]
        host=config.host,
        port=config.port,
        any_port_if_taken=config.any_port_if_taken,
    ) as server:
        yield server
