"""A production-shaped deployment on loopback: a 3-node JetStream cluster (three nats-server
processes), coordinator replicas and the chaos suite's recording agents, each a process of
its own, each connected where the test says (one node, or the seed list of all three)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from agentreach.broker import EmbeddedCluster
from tests.chaos.services import Services

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


class FailoverDeployment(Services):
    """Starts everything on enter (the cluster, then coordinators, then agents), stops
    everything on exit, whatever happened in between."""

    def __init__(
        self, workdir: Path, *, placement: Mapping[str, int | None] = DEFAULT_PLACEMENT
    ) -> None:
        self.cluster = EmbeddedCluster(3, store_dir=workdir / "cluster")
        self.placement = placement
        super().__init__(workdir, [name for name in placement if name.startswith("coordinator-")])

    @property
    def url(self) -> str:
        return self.cluster.url

    def _url_of(self, name: str) -> str:
        node = self.placement.get(name, SEEDS)
        return self.cluster.url if node is None else self.cluster.url_of(node)

    async def _start_servers(self) -> None:
        await self.cluster.__aenter__()

    async def _stop_servers(self) -> None:
        await self.cluster.stop()


def wall() -> float:
    """The wall clock, which the agents' records use too."""
    return time.time()
