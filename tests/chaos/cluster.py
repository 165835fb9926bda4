"""A whole deployment on loopback: nats-server with a store, coordinator replicas and the
recording agents, each a process of its own, and the faults a chaos run inflicts on them."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.chaos.accounting import Kill, Outage
from tests.chaos.processes import NatsServer, Service, UnexpectedExit, free_port
from tests.chaos.recorder import AGENT_IDS, AGENT_OBJECTS, RECORDS_ENV

REPO = Path(__file__).parents[2]
REACH = Path(sys.executable).parent / "reach"

# Short intervals: a CI run cannot wait out the production defaults (a killed replica's
# intake batch would come back after 30 s, a retry after seconds).
COORDINATOR_CONFIG = """\
intake: {ack_wait_s: 5}
delivery: {base_s: 0.2, cap_s: 1}
liveness: {tick_s: 0.25, probe_connection_s: 0.5, probe_ping_s: 0.5}
lease_ttl_s: 2
"""


class ChaosCluster:
    """Starts everything on enter, stops everything on exit (process groups, then the server)."""

    def __init__(self, workdir: Path, *, coordinators: int = 2) -> None:
        self.workdir = workdir
        self.records_dir = workdir / "records"
        self.logs_dir = workdir / "logs"
        for folder in (self.records_dir, self.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "coordinator.yaml"
        self.config_path.write_text(COORDINATOR_CONFIG)
        self.server = NatsServer(port=free_port(), store_dir=workdir / "nats")
        self.exits: list[UnexpectedExit] = []
        self.kills: list[Kill] = []
        self.outages: list[Outage] = []
        self.coordinators = {
            name: self._service(
                name, "coordinator", "--config", str(self.config_path), "--metrics-port", "0"
            )
            for name in (f"coordinator-{i}" for i in range(1, coordinators + 1))
        }
        self.agents = {
            agent_id: self._service(
                agent_id,
                "agent",
                f"tests.chaos.recorder:{AGENT_OBJECTS[agent_id]}",
                "--startup-delay",
                "0",
            )
            for agent_id in AGENT_IDS
        }

    @property
    def url(self) -> str:
        return self.server.url

    async def __aenter__(self) -> Self:
        try:
            await self.server.start()
            # Coordinators first: they provision the streams and buckets agents bind to.
            await asyncio.gather(*(s.start() for s in self.coordinators.values()))
            await asyncio.gather(*(s.start() for s in self.agents.values()))
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Agents and coordinators (drained, or killed after a while), then the server."""
        await asyncio.gather(*(s.stop() for s in self.agents.values()))
        await asyncio.gather(*(s.stop() for s in self.coordinators.values()))
        await self.server.stop()

    async def kill(self, name: str) -> Kill:
        """kill -9 the agent or coordinator ``name``."""
        pid, at = await self._named(name).kill()
        kill = Kill(name, pid, at)
        self.kills.append(kill)
        return kill

    async def restart(self, name: str) -> int:
        """Start the agent or coordinator ``name`` again (an agent keeps its id); its pid."""
        service = self._named(name)
        await service.start()
        return service.pid

    async def restart_server(self, outage_s: float) -> None:
        """Stop nats-server, leave it down for ``outage_s``, start it on the same port and store."""
        began = time.time()
        await self.server.stop()
        await asyncio.sleep(outage_s)  # the outage itself, not a wait for anything
        await self.server.start()
        self.outages.append(Outage(began, time.time()))

    def _named(self, name: str) -> Service:
        return self.agents.get(name) or self.coordinators[name]

    def _service(self, name: str, *args: str) -> Service:
        argv = [REACH, *args, "--nats-url", self.url, "--log-format", "json"]
        env = {**os.environ, RECORDS_ENV: str(self.records_dir), "PYTHONUNBUFFERED": "1"}
        return Service(
            name,
            argv,
            cwd=REPO,
            env=env,
            log_path=self.logs_dir / f"{name}.log",
            exits=self.exits,
        )
