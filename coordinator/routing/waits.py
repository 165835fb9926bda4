"""How long a task that cannot be routed now waits before it is looked at again, and the
lines that say tasks wait (one per reason and topic every few seconds, not one per task)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Collection

import structlog

from agentreach.broker.link import RepeatedLines
from agentreach.envelopes import Task

log = structlog.get_logger("coordinator.router")

WAIT_FIRST_S = 0.05
WAIT_MAX_S = 1.0
WAIT_LONG_S = 10.0  # after a minute of waiting: a task may wait a day, its checks must not
LONG_AFTER = 60
SAID_EVERY_S = 10.0
REMEMBERED = 100_000  # tasks waiting for room whose first full encounter is kept


class Waits:
    """The waits of the tasks this replica routes."""

    def __init__(self) -> None:
        # When each task waiting for room first found every queue full (monotonic s). Kept in
        # memory: a task that moves to another replica starts its wait again, within its ttl.
        self._full_since: OrderedDict[str, float] = OrderedDict()
        self._lines = RepeatedLines(SAID_EVERY_S)

    @property
    def waiting_for_room(self) -> Collection[str]:
        """Tasks that found every candidate's queue full and wait for room."""
        return self._full_since.keys()

    def agent_wait(self, topic: str, waited: int, left_ms: int) -> float:
        """Seconds until a task no agent can take now is looked at again (``waited``: how
        often it waited already): 50 ms doubling to 1 s, 10 s after a minute; within its ttl."""
        self._say("no agent can take it now", topic)
        longest = WAIT_MAX_S if waited < LONG_AFTER else WAIT_LONG_S
        # The exponent capped: past ~1,000 waits 2**waited no longer fits in a float.
        return min(WAIT_FIRST_S * 2 ** min(waited, 16), longest, left_ms / 1000 + 0.01)

    def room_wait(self, task: Task, waited: int, left_ms: int, limit_s: float) -> float | None:
        """Seconds until a task whose candidates are all full asks again; None once it has
        waited ``limit_s`` (``queues.full_wait_s``), or would outlive its ttl."""
        message_id, topic = task.message_id, task.topic
        now = time.monotonic()
        since = self._full_since.setdefault(message_id, now)
        while len(self._full_since) > REMEMBERED:
            self._full_since.popitem(last=False)
        left_s = min(limit_s - (now - since), left_ms / 1000)
        if left_s <= 0:
            self._full_since.pop(message_id, None)
            return None
        self._say("every queue is full", topic)
        return min(WAIT_FIRST_S * 2 ** min(waited, 8), WAIT_MAX_S, left_s)

    def done(self, message_id: str) -> None:
        """The task was routed (or ended): it waits no more."""
        self._full_since.pop(message_id, None)

    def _say(self, why: str, topic: str) -> None:
        """One line per reason and topic every SAID_EVERY_S, with how many waits there were
        meanwhile (a burst of 2,000 tasks said it 2,700 times in a second)."""
        if (waits := self._lines.due(f"{why} {topic}")) is not None:
            log.info(f"{why}; tasks wait", topic=topic, waits_since_last_line=waits)
