"""What the coordinator knows of each agent it judges, and which agents it judges: every
one that heartbeats, and every running agent with a card, beating or not, until an
operator forgets it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agentreach.coordinator.liveness.cadence import Cadence
from agentreach.envelopes import AgentCard, Heartbeat, Liveness, LivenessState, now_ms

HOUR_MS = 3_600_000


@dataclass
class Tracked:
    """What the coordinator knows of one agent."""

    agent_id: str
    interval_s: float
    last_seen: float  # monotonic, this process
    state: LivenessState = "UNKNOWN"
    since_ms: int = 0
    reason: str = ""
    epoch: int = 0
    quarantined: bool = False
    offline_at_ms: list[int] = field(default_factory=list)
    connected: bool = False  # a probe found its connection alive during this SUSPECT episode
    revision: int = 0  # of the last heartbeat taken into account
    seq: int = 0  # its seq (of the process ``epoch``)
    probe: asyncio.Task[None] | None = None
    cadence: Cadence | None = None
    in_flight: int = 0  # tasks running, by its last heartbeat
    # Presence checks between heartbeats (``PresenceChecks``): when the last one started, the
    # epoch whose process answered one, whether one runs now.
    checked_at: float = 0.0  # monotonic
    answered_epoch: int = -1
    checking: bool = False
    unanswered_at: float = -1.0  # the last_seen of the last check it did not answer in time

    def went_offline(self, flapping_limit: int) -> None:
        """Count an OFFLINE: more than ``flapping_limit`` within an hour quarantines it."""
        now = now_ms()
        self.offline_at_ms = [t for t in self.offline_at_ms if now - t < HOUR_MS] + [now]
        if len(self.offline_at_ms) > flapping_limit:
            self.quarantined = True

    def has_seen(self, revision: int, beat: Heartbeat | None) -> bool:
        """Whether the heartbeat at ``revision`` was taken into account already. A later beat
        of the same process (a higher ``seq``, or a later process) is new even at a lower
        revision: the bucket was made again (a server back on an empty store), and its
        revisions start over."""
        if not 0 < revision <= self.revision:
            return False
        return beat is None or (beat.epoch, beat.seq) <= (self.epoch, self.seq)

    @classmethod
    def restored(cls, agent_id: str, record: Liveness) -> Tracked:
        """As its stored verdict says, with a full offline threshold of grace from now."""
        return cls(
            agent_id=agent_id,
            interval_s=record.interval_s or 15.0,
            last_seen=time.monotonic(),
            state=record.state,
            since_ms=record.since_ms,
            reason=record.reason,
            epoch=record.epoch,
            quarantined=record.quarantined,
            offline_at_ms=list(record.offline_at_ms),
            answered_epoch=record.answered_epoch or -1,
        )

    def record(self) -> Liveness:
        return Liveness(
            agent_id=self.agent_id,
            state=self.state,
            since_ms=self.since_ms,
            reason=self.reason,
            epoch=self.epoch,
            interval_s=self.interval_s,
            quarantined=self.quarantined,
            offline_at_ms=self.offline_at_ms,
            answered_epoch=max(self.answered_epoch, 0),
        )


class Registered(Protocol):
    """The agents' cards, as the coordinator follows them (``AgentDirectory``)."""

    version: int  # rises with every change of a card
    refused: Mapping[str, Mapping[str, str]]  # agent → intent of its card → why not routed

    @property
    def cards(self) -> Mapping[str, AgentCard]: ...


def track_registered(
    agents: dict[str, Tracked], cards: Mapping[str, AgentCard], interval_s: float
) -> None:
    """Track each running agent's card that no heartbeat made known (and a new process of an
    agent judged OFFLINE) from now, as silent since it registered: routing sends it work
    already, and a process that died between registering and beating would keep it."""
    now = time.monotonic()
    for agent_id, card in cards.items():
        tracked = agents.get(agent_id)
        if card.status != "running" or (
            tracked is not None and (tracked.state != "OFFLINE" or tracked.epoch >= card.epoch)
        ):
            continue
        if tracked is None:
            tracked = agents[agent_id] = Tracked(agent_id, interval_s, now)
        tracked.state, tracked.epoch, tracked.last_seen = "UNKNOWN", card.epoch, now
        tracked.interval_s, tracked.cadence = interval_s, None


def untrack(agents: dict[str, Tracked], agent_id: str) -> None:
    """Judge ``agent_id`` no more: an operator forgot it (its card is deleted). A process
    that registers the id again starts afresh, not as one that went OFFLINE (or flapped)
    before; but quarantined, if it was: an agent may delete its own card, and did, while
    down, to start again unquarantined (a security re-test). ``reach agents clear`` lifts it.
    """
    tracked = agents.pop(agent_id, None)
    if tracked is None:
        return
    if tracked.probe is not None:
        tracked.probe.cancel()
    if tracked.quarantined:  # kept as OFFLINE: its queue is nobody's, its next process new
        agents[agent_id] = Tracked(
            agent_id,
            tracked.interval_s,
            tracked.last_seen,
            state="OFFLINE",
            reason="forgotten while quarantined",
            epoch=tracked.epoch,
            quarantined=True,
        )
