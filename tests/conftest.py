"""Fixtures: a real nats-server per test (or $NATS_URL), provisioned, with a coordinator."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentreach.broker import Broker, EmbeddedServer, Names, Topology, provision
from agentreach.coordinator import Coordinator, CoordinatorConfig, DeliveryConfig
from tests.support import Watcher

# Short retry intervals: the design's 1, 2, 4 … s would only make the tests slow.
FAST = CoordinatorConfig(delivery=DeliveryConfig(base_s=0.05, cap_s=0.2), lease_ttl_s=0.6)


@pytest.fixture
async def nats_url(tmp_path: Path) -> AsyncIterator[str]:
    """A fresh nats-server with JetStream on a free loopback port, or ``$NATS_URL``."""
    external = os.environ.get("NATS_URL")
    if external:
        yield external
        return
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
def names() -> Names:
    """The default names on a private server; a unique prefix on a shared one."""
    if os.environ.get("NATS_URL"):
        return Names(prefix=f"t{uuid.uuid4().hex[:10]}")
    return Names()


@pytest.fixture
async def broker(nats_url: str, names: Names) -> AsyncIterator[Broker]:
    """A provisioned connection."""
    async with Broker(nats_url, names=names, name="test") as connection:
        await provision(connection, Topology.default(names))
        yield connection


@pytest.fixture
async def coordinator(broker: Broker) -> AsyncIterator[Coordinator]:
    """A running coordinator on its own connection, like a real deployment."""
    async with (
        Broker(broker.url, names=broker.names, name="coordinator") as own,
        Coordinator(own, FAST).running() as running,
    ):
        yield running


@pytest.fixture
def start_coordinator(broker: Broker):  # type: ignore[no-untyped-def]
    """Start a coordinator with a config of the test's own: ``async with start(config):``."""

    @contextlib.asynccontextmanager
    async def start(
        config: CoordinatorConfig, config_path: Path | None = None
    ) -> AsyncIterator[Coordinator]:
        async with (
            Broker(broker.url, names=broker.names, name="coordinator") as own,
            Coordinator(own, config, config_path=config_path).running() as running,
        ):
            yield running

    return start


@pytest.fixture
async def watcher(broker: Broker) -> AsyncIterator[Watcher]:
    """Awaits events and dead letters as they are published."""
    async with Watcher(broker) as w:
        yield w
