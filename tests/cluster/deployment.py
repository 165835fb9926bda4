"""A production-shaped deployment on loopback: a 3-node JetStream cluster (three nats-server
processes), coordinator replicas and the chaos suite's recording agents, each a process of
its own, each connected where the test says (one node, or the seed list of all three)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from agentreach.broker import EmbeddedCluster
from tests.chaos.accounting import Kill
from tests.chaos.cluster import COORDINATOR_CONFIG, REACH, REPO
from tests.chaos.processes import Service, UnexpectedExit
from tests.chaos.recorder import AGENT_IDS, AGENT_OBJECTS, RECORDS_ENV

SEEDS = None  # connect through the seed list rather than to one node
# Where each service connects: coordinators and agents on different nodes (and one on the
# seed list), so that a kill -9 of any node takes some of them with it.
DEFAULT_PLACEMENT: Mapping[str, int | None] = {
    "coordinator-1": 0,
    "coordinator-2": 1,
    "chaos-a": 1,
    "chaos-b": 2,
    "chaos-c": SEEDS,
}


class FailoverDeployment:
    """Starts everything on enter (the cluster, then coordinators, then agents), stops
    everything on exit, whatever happened in between."""

    def __init__(
        self, workdir: Path, *, placement: Mapping[str, int | None] = DEFAULT_PLACEMENT
    ) -> None:
        self.workdir = workdir
        self.records_dir = workdir / "records"
        self.logs_dir = workdir / "logs"
        for folder in (self.records_dir, self.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "coordinator.yaml"
        self.config_path.write_text(COORDINATOR_CONFIG)
        self.cluster = EmbeddedCluster(3, store_dir=workdir / "cluster")
        self.placement = placement
        self.exits: list[UnexpectedExit] = []
        self.kills: list[Kill] = []
        names = [name for name in placement if name.startswith("coordinator-")]
        self.coordinators = {
            name: self._service(name, "coordinator", "--config", str(self.config_path))
            for name in names
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
        return self.cluster.url

    async def __aenter__(self) -> Self:
        try:
            await self.cluster.__aenter__()
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
        """Agents and coordinators (drained, or killed after a while), then every node."""
        await asyncio.gather(*(s.stop() for s in self.agents.values()))
        await asyncio.gather(*(s.stop() for s in self.coordinators.values()))
        await self.cluster.stop()

    async def kill(self, name: str) -> Kill:
        """kill -9 the agent or coordinator ``name``."""
        service = self.agents.get(name) or self.coordinators[name]
        pid, at = await service.kill()
        kill = Kill(name, pid, at)
        self.kills.append(kill)
        return kill

    async def restart(self, name: str) -> int:
        service = self.agents.get(name) or self.coordinators[name]
        await service.start()
        return service.pid

    def _service(self, name: str, *args: str) -> Service:
        node = self.placement.get(name, SEEDS)
        url = self.cluster.url if node is None else self.cluster.url_of(node)
        argv = [REACH, *args, "--nats-url", url, "--log-format", "json"]
        env = {**os.environ, RECORDS_ENV: str(self.records_dir), "PYTHONUNBUFFERED": "1"}
        env.pop("NATS_URL", None)
        return Service(
            name,
            argv,
            cwd=REPO,
            env=env,
            log_path=self.logs_dir / f"{name}.log",
            exits=self.exits,
        )


def wall() -> float:
    """The wall clock, which the agents' records use too."""
    return time.time()
