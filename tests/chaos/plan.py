"""What a chaos run does: how much work, how fast, and which faults after which task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tests.chaos.recorder import AGENT_IDS

# The server is stopped cleanly (it writes its state), or killed -9 every second round (it
# loses the acknowledgements it had not applied, and delivers those messages again as new).
FaultKind = Literal["agent", "coordinator", "server", "server_kill"]
# When a killed agent comes back: at once (its queue is redelivered to the new process), or
# once the coordinator has judged it OFFLINE (its queue has moved to the other agents).
Restart = Literal["at_once", "when_offline"]


@dataclass(frozen=True)
class Fault:
    """One fault, inflicted once ``at_task`` tasks are published."""

    at_task: int
    kind: FaultKind
    target: str
    restart: Restart = "at_once"


@dataclass(frozen=True)
class ChaosPlan:
    """How much work, how fast, and how many rounds of the three faults."""

    tasks: int = 2_000
    rate: float = 60.0  # tasks published per second
    rounds: int = 1  # each round: kill -9 an agent, a coordinator, stop or kill nats-server
    restarts: tuple[Restart, ...] = ("at_once",)  # of the killed agent, round after round
    coordinators: int = 2
    work_ms: int = 100  # each execution's duration: a kill lands mid-task
    ttl_ms: int = 60_000
    # How long nats-server stays down: longer than a client's 5 s request timeout, so that
    # writes made during the outage fail instead of waiting in the reconnect buffer.
    outage_s: float = 6.0
    settle_timeout_s: float = 90.0  # after the last publish
    flows: int = 0  # workflow instances (two-step chains) started beside the tasks

    @property
    def flow_every(self) -> int:
        """Tasks published for each instance started (0: none is)."""
        return max(1, self.tasks // self.flows) if self.flows else 0

    def faults(self) -> list[Fault]:
        """The faults, spread evenly over the publishing (none in its first or last tenth)."""
        kinds: list[tuple[FaultKind, str, Restart]] = []
        for r in range(self.rounds):
            kinds += [
                ("agent", AGENT_IDS[r % len(AGENT_IDS)], self.restarts[r % len(self.restarts)]),
                ("coordinator", f"coordinator-{r % self.coordinators + 1}", "at_once"),
                ("server_kill" if r % 2 else "server", "nats-server", "at_once"),
            ]
        span = 0.8 * self.tasks
        return [
            Fault(int(0.1 * self.tasks + span * (i + 1) / (len(kinds) + 1)), *kind)
            for i, kind in enumerate(kinds)
        ]
