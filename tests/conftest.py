"""Fixtures: a real nats-server per test (or $NATS_URL), provisioned, with a coordinator."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentreach.broker import Auth, Broker, EmbeddedServer, Names, Topology, provision
from agentreach.coordinator import Coordinator, CoordinatorConfig, DeliveryConfig
from agentreach.coordinator.protection.grants import UNSEALED_ENV
from tests.secured import SECURED, SecuredDeployment, parties_connect_as_themselves, secured_server
from tests.support import Watcher

# Short retry intervals: the design's 1, 2, 4 … s would only make the tests slow.
FAST = CoordinatorConfig(delivery=DeliveryConfig(base_s=0.05, cap_s=0.2), lease_ttl_s=0.6)


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> SecuredDeployment:
    """An auth directory (``reach auth init``) shared by the session's secured servers."""
    return SecuredDeployment(tmp_path_factory.mktemp("auth"))


@pytest.fixture(autouse=True)
def _secured_parties(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # Most tests run coordinators on secured servers without the seal key (allowances not
    # enforced); the sealed ones give it (tests.secured.sealed_deployment).
    monkeypatch.setenv(UNSEALED_ENV, "1")
    if SECURED:
        deployment = request.getfixturevalue("deployment")
        monkeypatch.setenv("NATS_CREDS", str(deployment.admin.creds))
        parties_connect_as_themselves(deployment, monkeypatch)


def coordinator_auth(request: pytest.FixtureRequest) -> Auth | None:
    return request.getfixturevalue("deployment").coordinator if SECURED else None


@pytest.fixture
async def nats_url(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh nats-server with JetStream on a free loopback port, or ``$NATS_URL``."""
    external = os.environ.get("NATS_URL")
    if external:
        yield external
        return
    if SECURED:
        deployment = request.getfixturevalue("deployment")
        async with secured_server(deployment, tmp_path / "nats") as server:
            yield server.url
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
async def coordinator(broker: Broker, request: pytest.FixtureRequest) -> AsyncIterator[Coordinator]:
    """A running coordinator on its own connection, like a real deployment."""
    auth = coordinator_auth(request)
    async with (
        Broker(broker.url, names=broker.names, name="coordinator", auth=auth) as own,
        Coordinator(own, FAST).running() as running,
    ):
        yield running


@pytest.fixture
def start_coordinator(broker: Broker, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Start a coordinator with a config of the test's own: ``async with start(config):``."""

    @contextlib.asynccontextmanager
    async def start(
        config: CoordinatorConfig, config_path: Path | None = None
    ) -> AsyncIterator[Coordinator]:
        async with (
            Broker(
                broker.url, names=broker.names, name="coordinator", auth=coordinator_auth(request)
            ) as own,
            Coordinator(own, config, config_path=config_path).running() as running,
        ):
            yield running

    return start


@pytest.fixture
async def watcher(broker: Broker) -> AsyncIterator[Watcher]:
    """Awaits events and dead letters as they are published."""
    async with Watcher(broker) as w:
        yield w
