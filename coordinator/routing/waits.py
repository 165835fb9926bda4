"""How long a task that cannot be routed now waits before it is looked at again, and the
lines that say tasks wait (one per reason and topic every few seconds, not one per task)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Collection

import structlog

from agentreach.envelopes import Task
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.router")

WAIT_FIRST_S = 0.05
WAIT_MAX_S = 1.0
WAIT_LONG_S = 10.0  # after a minute of waiting: a task may wait a day, its checks must not
LONG_AFTER = 60
SAID_EVERY_S = 10.0
REMEMBERED = 100_000  # tasks waiting for room whose first full encounter is kept
# A task held back for an agent counts as held until it is looked at again, and this long
# more (then another replica may hold it, or it went on).
HELD_MARGIN_S = 2.0


class Waits:
    """The waits of the tasks this replica routes."""

    def __init__(self) -> None:
        # When each task waiting for room first found every queue full (monotonic s). Kept in
        # memory: a task that moves to another replica starts its wait again, within its ttl.
        # Keyed by caller and message id: one caller's id may be another's (a task sent under
        # alice's would have made hers give up early, its wait counted from the other's).
        self._full_since: OrderedDict[tuple[str | None, str], float] = OrderedDict()
        # Tasks no agent can take now: (caller, message id) -> (topic, counted until, s).
        self._held: OrderedDict[tuple[str | None, str], tuple[str, float]] = OrderedDict()
        self._lines = RepeatedLines(SAID_EVERY_S)

    @property
    def waiting_for_room(self) -> Collection[str]:
        """Tasks that found every candidate's queue full and wait for room (message ids)."""
        return [message_id for _, message_id in self._full_since]

    def agent_wait(self, task: Task, waited: int, left_ms: int) -> float:
        """Seconds until a task no agent can take now is looked at again (``waited``: how
        often it waited already): 50 ms doubling to 1 s, 10 s after a minute; within its ttl."""
        self._say("no agent can take it now", task.topic)
        longest = WAIT_MAX_S if waited < LONG_AFTER else WAIT_LONG_S
        # The exponent capped: past ~1,000 waits 2**waited no longer fits in a float.
        wait_s = min(WAIT_FIRST_S * 2 ** min(waited, 16), longest, left_ms / 1000 + 0.01)
        self._held[_run(task)] = (task.topic, time.monotonic() + wait_s + HELD_MARGIN_S)
        self._held.move_to_end(_run(task))
        while len(self._held) > REMEMBERED:
            self._held.popitem(last=False)
        return wait_s

    def held_by_topic(self) -> dict[str, int]:
        """How many tasks this replica holds back because no agent can take them, by topic
        (the ``reach_tasks_held`` gauge: a topic whose agents are all gone, isolated or
        SUSPECT keeps its tasks here while other topics flow)."""
        now = time.monotonic()
        for run in [r for r, (_, until) in self._held.items() if until <= now]:
            del self._held[run]
        counts: dict[str, int] = {}
        for topic, _ in self._held.values():
            counts[topic] = counts.get(topic, 0) + 1
        return counts

    def room_wait(self, task: Task, waited: int, left_ms: int, limit_s: float) -> float | None:
        """Seconds until a task whose candidates are all full asks again; None once it has
        waited ``limit_s`` (``queues.full_wait_s``), or would outlive its ttl."""
        run, topic = _run(task), task.topic
        now = time.monotonic()
        since = self._full_since.setdefault(run, now)
        while len(self._full_since) > REMEMBERED:
            self._full_since.popitem(last=False)
        left_s = min(limit_s - (now - since), left_ms / 1000)
        if left_s <= 0:
            self._full_since.pop(run, None)
            return None
        self._say("every queue is full", topic)
        return min(WAIT_FIRST_S * 2 ** min(waited, 8), WAIT_MAX_S, left_s)

    def done(self, task: Task) -> None:
        """The task was routed (or ended): it waits no more."""
        self._full_since.pop(_run(task), None)
        self._held.pop(_run(task), None)

    def _say(self, why: str, topic: str) -> None:
        """One line per reason and topic every SAID_EVERY_S, with how many waits there were
        meanwhile (a burst of 2,000 tasks said it 2,700 times in a second)."""
        if (waits := self._lines.due(f"{why} {topic}")) is not None:
            log.info(f"{why}; tasks wait", topic=topic, waits_since_last_line=waits)


def _run(task: Task) -> tuple[str | None, str]:
    return task.caller, task.message_id
