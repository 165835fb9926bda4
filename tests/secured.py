"""A secured deployment for the tests: ``reach auth``'s directory, creds issued on demand
for each party, and a nats-server that trusts them (decentralized JWT auth)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from agentreach.auth import AuthDirectory
from agentreach.broker import Auth, Broker, EmbeddedServer, Names

if TYPE_CHECKING:
    from agentreach.coordinator import Coordinator

# REACH_TEST_SECURED=1 runs the whole suite on a secured server: every agent, worker and
# client connects with creds of its own (as in production), the coordinator with its
# service identity (grants, which tests that dispatch by hand would lack, are tested
# on their own in tests/e2e/test_security.py), the tests themselves as an operator (``admin``).
SECURED = os.environ.get("REACH_TEST_SECURED") == "1"


class SecuredDeployment:
    """One auth directory; ``auth(role, name)`` issues that party's creds the first time."""

    def __init__(self, root: Path, names: Names | None = None) -> None:
        self.directory = AuthDirectory(root, names=names)
        self.directory.init()
        self._issued: dict[str, str] = {"coordinator": "coordinator", "admin": "operator"}

    def auth(self, role: str, name: str) -> Auth:
        if self._issued.get(name) != role:
            self.directory.issue(role, name)
            self._issued[name] = role
        return Auth(creds=self.directory.creds(role, name))

    def issued_as(self, name: str) -> str | None:
        """The role ``name`` was issued with in this deployment, if any."""
        return self._issued.get(name)

    @property
    def admin(self) -> Auth:
        return self.auth("operator", "admin")

    @property
    def coordinator(self) -> Auth:
        return self.auth("coordinator", "coordinator")

    @property
    def seal_key_file(self) -> str:
        return str(self.directory.seal_key)

    def server_config(self, folder: Path) -> Path:
        """A nats-server config of its own for a server whose files live in ``folder``: a
        free loopback port, JetStream, the deployment's accounts."""
        folder.mkdir(parents=True, exist_ok=True)
        include = folder / "auth.conf"
        include.write_text(self.directory.server_config_text(folder / "jwt"))
        config = folder / "nats-server.conf"
        config.write_text(
            f'listen: "127.0.0.1:-1"\njetstream {{ store_dir: "{folder / "store"}" }}\n'
            'include "auth.conf"\n'
        )
        return config


@contextlib.asynccontextmanager
async def secured_server(
    deployment: SecuredDeployment, folder: Path, on_log: Callable[[str], None] | None = None
) -> AsyncIterator[EmbeddedServer]:
    """A nats-server with JetStream on a free loopback port that admits only the
    deployment's users."""
    async with EmbeddedServer(
        port=-1,
        store_dir=folder / "store",
        config=deployment.server_config(folder),
        on_log=on_log,
    ) as server:
        yield server


def parties_connect_as_themselves(deployment: SecuredDeployment, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Make every agent, compensation worker and client of a test open a connection of its
    own with its own creds, even when the test hands it the shared (admin) ``broker``: the
    whole suite then runs under the permissions each party has in production."""
    import agentreach.agents.agent as agent_module
    import agentreach.agents.compensation as compensation_module
    from agentreach.agents.client import ReachClient

    roles = {"agent": "agent", "compensation": "worker"}

    @contextlib.asynccontextmanager
    async def connected(  # type: ignore[no-untyped-def]
        broker, nats_url, *, name, names=None, wait=False, auth=None
    ) -> AsyncIterator[Broker]:
        kind, _, identity = name.partition(":")
        if broker is not None and auth is None:
            nats_url, names = broker.url, broker.names
            auth = deployment.auth(roles[kind], identity)
        async with Broker(nats_url, name=name, names=names, wait=wait, auth=auth) as own:
            yield own

    monkeypatch.setattr(agent_module, "connected", connected)
    monkeypatch.setattr(compensation_module, "connected", connected)
    original_init = ReachClient.__init__

    def client_init(self, nats_url=None, *, broker=None, names=None, name="client", auth=None):  # type: ignore[no-untyped-def]
        # Only the shared admin connection is swapped for the caller's own: one of a party's
        # own (an agent's, which sends its sub-tasks as itself), or one to an open server of
        # the test's, is kept.
        if broker is not None and auth is None and broker.auth.role == "operator":
            nats_url, names, broker = broker.url, broker.names, None
            # An agent's own client (its sub-tasks) calls with the agent's creds.
            role = "agent" if deployment.issued_as(name) == "agent" else "caller"
            auth = deployment.auth(role, name)
        original_init(self, nats_url, broker=broker, names=names, name=name, auth=auth)

    monkeypatch.setattr(ReachClient, "__init__", client_init)


def operators_reply_to(broker: Broker, box: str) -> tuple[str, str]:
    """Where an operator's bare task asks for replies, and what to subscribe to: its own
    inbox on an open server; secured, a reply box of its own (agents answer only there)."""
    if SECURED:
        subject = broker.names.reply_box("admin", box)
        return subject, f"{subject}.*"
    inbox = broker.nc.new_inbox()
    return inbox, inbox


@contextlib.asynccontextmanager
async def sealed_deployment(
    deployment: SecuredDeployment, folder: Path, workflows: dict[str, Any] | None = None
) -> AsyncIterator[tuple[str, Broker, Coordinator]]:
    """A secured server with its streams provisioned, the deployment's intent allowances
    pushed (issue agents with ``deployment.directory.issue`` or ``allow`` first), and a
    coordinator with its own creds, the seal key and ``workflows``: ``(url, admin,
    coordinator)``."""
    from agentreach.broker import Topology, provision
    from agentreach.cli.auth import push_allowances
    from agentreach.coordinator import Coordinator
    from agentreach.coordinator.protection.grants import SecurityConfig
    from tests.conftest import FAST

    config = msgspec.structs.replace(
        FAST,
        security=SecurityConfig(seal_key_file=deployment.seal_key_file),
        workflows=workflows or {},
    )
    async with (
        secured_server(deployment, folder) as server,
        Broker(server.url, name="admin", auth=deployment.admin) as admin,
        Broker(server.url, name="coordinator", auth=deployment.coordinator) as own,
    ):
        await provision(admin, Topology.default(admin.names))
        await push_allowances(deployment.directory, server.url, auth=deployment.admin)
        async with Coordinator(own, config).running() as coordinator:
            yield server.url, admin, coordinator
