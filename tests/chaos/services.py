"""What every loopback deployment of the suites shares: coordinator replicas and the
recording agents, each a process of its own, started after the servers (coordinators
first: they provision what agents bind to), stopped before them, killed and restarted by
name. A subclass says which servers, and where each service connects."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.chaos.accounting import Kill, Outage
from tests.chaos.flows import FLOW_CONFIG
from tests.chaos.processes import Service, UnexpectedExit
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


class Services:
    """Coordinators ``coordinator_names`` and the recording agents, in ``workdir``."""

    def __init__(self, workdir: Path, coordinator_names: Iterable[str]) -> None:
        self.workdir = workdir
        self.records_dir = workdir / "records"
        self.logs_dir = workdir / "logs"
        for folder in (self.records_dir, self.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "coordinator.yaml"
        self.config_path.write_text(COORDINATOR_CONFIG + FLOW_CONFIG)
        self.exits: list[UnexpectedExit] = []
        self.kills: list[Kill] = []
        self.away: dict[int, list[Outage]] = {}
        config = ("--config", str(self.config_path), "--metrics-port", "0")
        self.coordinators = {
            name: self._service(name, "coordinator", *config) for name in coordinator_names
        }
        recorder = "tests.chaos.recorder:{}"
        self.agents = {
            agent_id: self._service(
                agent_id, "agent", recorder.format(AGENT_OBJECTS[agent_id]), "--startup-delay", "0"
            )
            for agent_id in AGENT_IDS
        }

    async def _start_servers(self) -> None:
        raise NotImplementedError

    async def _stop_servers(self) -> None:
        raise NotImplementedError

    def _url_of(self, name: str) -> str:
        """Where the service ``name`` connects."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self._start_servers()
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
        """Agents and coordinators (drained, or killed after a while), then the servers."""
        await asyncio.gather(*(s.stop() for s in self.agents.values()))
        await asyncio.gather(*(s.stop() for s in self.coordinators.values()))
        await self._stop_servers()

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

    def _named(self, name: str) -> Service:
        return self.agents.get(name) or self.coordinators[name]

    def _service(self, name: str, *args: str) -> Service:
        argv = [REACH, *args, "--nats-url", self._url_of(name), "--log-format", "json"]
        env = {**os.environ, RECORDS_ENV: str(self.records_dir), "PYTHONUNBUFFERED": "1"}
        env.pop("NATS_URL", None)  # where it connects is the deployment's
        return Service(
            name,
            argv,
            cwd=REPO,
            env=env,
            log_path=self.logs_dir / f"{name}.log",
            exits=self.exits,
            away=self.away,
        )
