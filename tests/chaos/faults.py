"""Inflicting a chaos run's faults in order, while the tasks are being published."""

from __future__ import annotations

import time

from agentreach.broker import Broker, BrokerError
from tests.chaos.cluster import ChaosCluster
from tests.chaos.observe import until_state
from tests.chaos.plan import ChaosPlan, Fault
from tests.chaos.processes import StartFailed
from tests.chaos.publisher import Clock, Publisher, Say

OFFLINE_TIMEOUT_S = 30.0  # a killed agent not judged OFFLINE by then is a liveness failure


class Chaos:
    """Inflicts the plan's faults, each once enough tasks are published; keeps a log."""

    def __init__(
        self, cluster: ChaosCluster, broker: Broker, plan: ChaosPlan, clock: Clock, say: Say
    ) -> None:
        self._cluster = cluster
        self._broker = broker
        self._plan = plan
        self._clock = clock
        self._say = say
        self.log: list[str] = []
        self.errors: list[str] = []

    async def run(self, publisher: Publisher) -> None:
        for fault in self._plan.faults():
            if not await publisher.reached(fault.at_task):
                return
            began, started = str(self._clock), time.monotonic()
            try:
                what = await self._inflict(fault)
            except (StartFailed, BrokerError) as exc:
                what = f"{fault.kind} {fault.target}: FAILED"
                self.errors.append(f"{fault.kind} {fault.target}: {exc}")
            took = time.monotonic() - started
            entry = f"[{began}] after task {fault.at_task:,}: {what} (took {took:.1f} s)"
            self.log.append(entry)
            self._say(entry)

    async def _inflict(self, fault: Fault) -> str:
        cluster = self._cluster
        if fault.kind in ("server", "server_kill"):
            killed = fault.kind == "server_kill"
            await cluster.restart_server(self._plan.outage_s, kill=killed)
            how = "killed -9" if killed else "stopped"
            return f"nats-server {how}, down {self._plan.outage_s:g} s, restarted"
        kill = await cluster.kill(fault.target)
        waited = ""
        if fault.restart == "when_offline":
            if await until_state(self._broker, fault.target, "OFFLINE", OFFLINE_TIMEOUT_S):
                waited = " once judged OFFLINE"
            else:
                waited = f" after {OFFLINE_TIMEOUT_S:g} s"
                self.errors.append(
                    f"{fault.target} killed but not judged OFFLINE within {OFFLINE_TIMEOUT_S:g} s"
                )
        pid = await cluster.restart(fault.target)
        return f"kill -9 {fault.target} (pid {kill.pid}), restarted{waited} as pid {pid}"
