"""How full each agent's dispatch queue is, per priority, with watermarks.

The broker is the truth: a work-queue stream keeps a dispatched message until
the agent acknowledges it, and each agent's subject is capped (discard-new per
subject). This view reads the per-subject counts every ``refresh_s`` and adds
what this replica dispatched since, so the router can prefer the less loaded and
stop feeding an agent above the high watermark until it drains below the low one.
"""

from __future__ import annotations

import asyncio

import msgspec
import structlog

from agentreach.broker import Broker, BrokerError
from agentreach.broker.direct import subject_counts
from agentreach.broker.errors import pause
from agentreach.broker.pauses import Pause
from agentreach.broker.topology import DEFAULT_QUEUE_CAPACITY
from agentreach.coordinator.units import NonNegativeSeconds, Positive, PositiveSeconds, Ratio
from agentreach.envelopes import PRIORITIES, Event, Priority

log = structlog.get_logger("coordinator.queues")


class QueueConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-agent dispatch queues: a broker-enforced capacity per priority, and watermarks.

    An agent whose queue passes ``high_watermark`` of its capacity gets no new work
    until it is back under ``low_watermark``. A task whose every candidate is that full
    waits for room, within its ttl, for up to ``full_wait_s`` (a burst, such as the backlog
    released after a failover, drains in seconds); after that, or at once with 0, it is
    rejected as ``backpressure``, so that a sender facing a lasting overload learns it.
    """

    capacity: dict[Priority, Positive] = {}
    high_watermark: Ratio = 0.8
    low_watermark: Ratio = 0.5
    refresh_s: PositiveSeconds = 0.25  # how often queue depths are read from the broker
    full_wait_s: NonNegativeSeconds = 10.0

    def __post_init__(self) -> None:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark {self.low_watermark} must be below"
                f" high_watermark {self.high_watermark}"
            )

    def capacity_of(self, priority: Priority) -> int:
        return self.capacity.get(priority) or DEFAULT_QUEUE_CAPACITY[priority]

    @property
    def capacities(self) -> dict[Priority, int]:
        return {p: self.capacity_of(p) for p in DEFAULT_QUEUE_CAPACITY}


Slot = tuple[str, Priority]


class QueueDepths:
    """Queue depth and watermark state per (agent, priority)."""

    def __init__(self, broker: Broker, config: QueueConfig) -> None:
        self._broker = broker
        self._pause = Pause(broker, "cannot read queue depths", "reading queue depths again")
        self._config = config
        self._depths: dict[Slot, int] = {}
        # Dispatched by this replica and not yet in a read (or reported back): message id ->
        # its stream sequence, 0 while its publish is in flight (the place is taken at once:
        # a batch routed together must not see the same room).
        self._unread: dict[Slot, dict[str, int]] = {}
        self._above: set[Slot] = set()  # passed the high watermark, not yet below the low

    def capacity(self, priority: Priority) -> int:
        return self._config.capacity_of(priority)

    @property
    def full_wait_s(self) -> float:
        """How long a task whose every candidate is full waits for room."""
        return self._config.full_wait_s

    def depth(self, agent_id: str, priority: Priority) -> int:
        slot = (agent_id, priority)
        return self._depths.get(slot, 0) + len(self._unread.get(slot, ()))

    def why_full(self, agent_id: str, priority: Priority) -> str | None:
        """None while the agent may take work at ``priority``; else why not."""
        if (agent_id, priority) not in self._above:
            return None
        depth, capacity = self.depth(agent_id, priority), self.capacity(priority)
        if depth / capacity >= self._config.high_watermark:
            # Its stream holds at most `capacity`; dispatches still on their way (some to be
            # refused there) counted too made a drill's letters say "(262/200)".
            return f"{priority} queue above the high watermark ({min(depth, capacity)}/{capacity})"
        # Between the watermarks: it passed the high one and has not drained enough yet.
        low = int(capacity * self._config.low_watermark)
        return (
            f"{priority} queue still above the low watermark (hysteresis):"
            f" {depth}/{capacity}, fed again at {low}"
        )

    def slots(self) -> set[Slot]:
        """Every (agent, priority) with something queued or dispatched since the last read."""
        return set(self._depths) | {slot for slot, ids in self._unread.items() if ids}

    def reserve(self, agent_id: str, priority: Priority, message_id: str) -> None:
        """A task is on its way to the agent's queue: its place counts from now."""
        slot = (agent_id, priority)
        self._unread.setdefault(slot, {})[message_id] = 0
        self._judge(slot)

    def stored(self, agent_id: str, priority: Priority, message_id: str, seq: int) -> None:
        """The queue's stream took the task as ``seq``: a read from then on counts it."""
        unread = self._unread.get((agent_id, priority))
        if unread is not None and message_id in unread:
            unread[message_id] = seq

    def release(self, agent_id: str, priority: Priority, message_id: str) -> None:
        """The task did not reach the queue after all."""
        slot = (agent_id, priority)
        if (unread := self._unread.get(slot)) is not None and unread.pop(
            message_id, None
        ) is not None:
            self._judge(slot)

    async def finished(self, event: Event, stored_ms: int) -> None:
        """An agent reported an outcome: that task has left its queue."""
        if event.agent_id is None:
            return
        for priority in PRIORITIES:
            slot = (event.agent_id, priority)
            unread = self._unread.get(slot)
            if unread and unread.pop(event.message_id, None) is not None:
                self._judge(slot)

    def refused(self, agent_id: str, priority: Priority) -> None:
        """The broker said the queue is at capacity."""
        slot = (agent_id, priority)
        self._depths[slot] = max(self._depths.get(slot, 0), self.capacity(priority))
        self._judge(slot)

    async def run(self, ready: asyncio.Event) -> None:
        """Read the depths every ``refresh_s`` until cancelled."""
        while True:
            try:
                await self.refresh()
                self._pause.ended()
            except BrokerError as exc:
                self._pause.failed(exc)
            ready.set()
            await pause(self._config.refresh_s)

    async def refresh(self) -> None:
        """Read every queue's depth; a task this replica dispatched stays counted apart until
        a read includes it (stored at or before the stream's last sequence then): counted
        neither twice (a false trip of the high watermark holds the queue until the low one)
        nor not at all."""
        names = self._broker.names
        reads = {
            priority: await subject_counts(
                self._broker, names.dispatch_stream(priority), names.dispatch_wildcard(priority)
            )
            for priority in PRIORITIES
        }
        # Taken over in one step, after every read: a routing between two reads would see a
        # task dropped from the unread but not yet in the depths, a full queue as empty.
        depths: dict[Slot, int] = {}
        for priority, (counts, last_seq) in reads.items():
            for subject, count in counts.items():
                depths[(names.agent_of_dispatch_subject(subject), priority)] = count
            for (_, of), unread in self._unread.items():
                if of == priority:
                    for message_id in [m for m, seq in unread.items() if 0 < seq <= last_seq]:
                        del unread[message_id]
        self._depths = depths
        for slot in set(depths) | self._above:
            self._judge(slot)

    def _judge(self, slot: Slot) -> None:
        ratio = self.depth(*slot) / self.capacity(slot[1])
        if ratio >= self._config.high_watermark:
            self._above.add(slot)
        elif ratio <= self._config.low_watermark:
            self._above.discard(slot)
