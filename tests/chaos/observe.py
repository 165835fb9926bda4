"""What a chaos run reads back: work still in flight on the broker, the dead letters, and the
agents' records as they grow."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from agentreach import envelopes
from agentreach.broker import Broker, BucketWatch, read_stream
from agentreach.envelopes import DeadLetter, Liveness, LivenessState
from tests.chaos.flows import unended
from tests.chaos.recorder import Record

InFlight = dict[str, int]


async def in_flight(broker: Broker) -> InFlight | None:
    """Messages not yet settled anywhere work waits: intake, the agents' queues, the
    coordinator's outcome and advisory consumers; None while the server cannot say.

    Every step publishes its next message before it removes its own, so work moving
    between two places is seen in one of them or the other.
    """
    names, js = broker.names, broker.js
    counts: InFlight = {}
    try:
        counts["intake"] = (await js.stream_info(names.tasks_stream)).state.messages
        for priority, stream in names.dispatch_streams.items():
            counts[f"queued {priority}"] = (await js.stream_info(stream)).state.messages
        for label, stream, durable in (
            ("outcomes", names.events_stream, names.coordinator_outcomes),
            ("advisories", names.advisories_stream, names.coordinator_advisories),
        ):
            info = await js.consumer_info(stream, durable)
            counts[label] = info.num_pending + info.num_ack_pending
    except Exception:  # a restarting server, a consumer not made yet: nothing to conclude
        return None
    return counts


async def dead_letter_count(broker: Broker) -> int | None:
    """How many dead letters REACH_DLQ holds; None while the server cannot say."""
    with contextlib.suppress(Exception):
        return (await broker.js.stream_info(broker.names.dlq_stream)).state.messages
    return None


async def dead_letters(broker: Broker) -> list[DeadLetter]:
    """Every dead letter in REACH_DLQ, oldest first."""
    names = broker.names
    stored = await read_stream(broker, names.dlq_stream, names.dlq_wildcard, limit=10_000_000)
    return [envelopes.decode_dead_letter(m.data) for m in stored]


async def until_state(
    broker: Broker, agent_id: str, state: LivenessState, timeout_s: float
) -> bool:
    """Until the coordinator judges ``agent_id`` to be ``state`` (True), or ``timeout_s``."""
    kv = await broker.kv(broker.names.liveness_bucket)
    try:
        async with asyncio.timeout(timeout_s), BucketWatch(kv) as watch:
            async for change in watch:
                if change.key != agent_id or change.value is None:
                    continue
                if msgspec.json.decode(change.value, type=Liveness).state == state:
                    return True
    except TimeoutError:
        pass
    return False


class RecordsTail:
    """The agents' records read as they are appended (each file from where it was left)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._offsets: dict[Path, int] = {}
        self.done: set[str] = set()

    def read_new(self) -> list[Record]:
        found: list[Record] = []
        for path in sorted(self._directory.glob("*.log")):
            with path.open("rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line being written waits for later
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            lines = complete.decode(errors="replace").splitlines()
            found += [r for line in lines if (r := Record.parse(line)) is not None]
        self.done.update(r.message_id for r in found if r.phase == "done")
        return found


class Progress:
    """How far a run has settled: ids accounted for (run to the end, or dead-lettered) and
    what is still in flight, looked at again on each :meth:`look`."""

    def __init__(
        self, broker: Broker, records_dir: Path, sent: list[str], flows: Sequence[str] = ()
    ) -> None:
        self._broker = broker
        self._sent = sent
        self._flows = flows  # workflow instances: in flight until they end
        self._records = RecordsTail(records_dir)
        self._letters: set[str] = set()
        self._letters_counted = -1
        self.accounted = 0
        self.in_flight: InFlight | None = None
        self._best = (0, float("inf"))  # the most accounted, the least in flight
        self._improved = time.monotonic()

    @property
    def quiet(self) -> bool:
        return self.in_flight is not None and not any(self.in_flight.values())

    def stalled_s(self) -> float:
        """Seconds since the last id was accounted for or work last left flight."""
        return time.monotonic() - self._improved

    async def look(self) -> None:
        self._records.read_new()
        size = await dead_letter_count(self._broker)
        if size is not None and size != self._letters_counted:
            self._letters = {d.message_id for d in await dead_letters(self._broker)}
            self._letters_counted = size
        self.in_flight = await in_flight(self._broker)
        running = await unended(self._broker, self._flows)
        if self.in_flight is not None:
            self.in_flight = None if running is None else {**self.in_flight, "workflows": running}
        done, letters = self._records.done, self._letters
        self.accounted = sum(1 for m in self._sent if m in done or m in letters)
        flying = sum(self.in_flight.values()) if self.in_flight else float("inf")
        if self.accounted > self._best[0] or flying < self._best[1]:
            self._best = (max(self.accounted, self._best[0]), min(flying, self._best[1]))
            self._improved = time.monotonic()
