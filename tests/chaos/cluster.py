"""A whole deployment on loopback: nats-server with a store, coordinator replicas and the
recording agents, each a process of its own, and the faults a chaos run inflicts on them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.chaos.accounting import Outage
from tests.chaos.processes import NatsServer, free_port
from tests.chaos.services import Services


class ChaosCluster(Services):
    """Starts everything on enter, stops everything on exit (process groups, then the server)."""

    def __init__(self, workdir: Path, *, coordinators: int = 2) -> None:
        self.server = NatsServer(port=free_port(), store_dir=workdir / "nats")
        self.outages: list[Outage] = []
        names = (f"coordinator-{i}" for i in range(1, coordinators + 1))
        super().__init__(workdir, names)

    @property
    def url(self) -> str:
        return self.server.url

    def _url_of(self, name: str) -> str:
        return self.url

    async def _start_servers(self) -> None:
        await self.server.start()

    async def _stop_servers(self) -> None:
        await self.server.stop()

    async def restart_server(self, outage_s: float, *, kill: bool = False) -> None:
        """Stop (``kill``: kill -9) nats-server, leave it down for ``outage_s``, start it on
        the same port and store."""
        began = time.time()
        await (self.server.kill() if kill else self.server.stop())
        await asyncio.sleep(outage_s)  # the outage itself, not a wait for anything
        await self.server.start()
        self.outages.append(Outage(began, time.time()))
