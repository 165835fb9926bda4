"""Sending a task to an agent that can take it — or saying, for good, why not.

A topic that no registered agent serves ends at once as ``no_route``. A topic
whose agents exist but cannot take work now (stopped, and later offline or
full) waits within the task's ttl and then ends as ``expired``.
"""

from __future__ import annotations

import random

import msgspec
import structlog

import envelopes
from broker import Broker
from broker.lifecycle import emit, event_for
from coordinator.directory import AgentDirectory
from coordinator.ending import end_with_error
from envelopes import ErrorInfo, Task
from envelopes import headers as h

log = structlog.get_logger("coordinator.router")

WAIT_FIRST_S = 0.05
WAIT_MAX_S = 1.0


class Router:
    """Chooses an agent for a task and dispatches it on the task's priority stream."""

    def __init__(self, broker: Broker, directory: AgentDirectory) -> None:
        self._broker = broker
        self._directory = directory

    async def dispatch(
        self, task: Task, *, left_ms: int, waited: int = 0, where: str = "intake"
    ) -> float | None:
        """Dispatch ``task`` with ``left_ms`` of its ttl left (the envelope carries that on).

        Returns None once the task is dispatched or ended, or the seconds to wait
        before asking again when agents exist but none can take it now;
        ``waited`` counts the times it has waited already.
        """
        if left_ms <= 0:
            await self.end(task, "expired", f"ttl {task.ttl_ms} ms passed in {where}")
            return None
        running, registered = await self._directory.candidates(task.topic)
        if not registered:
            await self.end(task, "no_route", f"no agent serves topic {task.topic!r}")
            return None
        if not running:
            log.info("no agent can take it now; waiting", registered=len(registered))
            return min(WAIT_FIRST_S * 2**waited, WAIT_MAX_S, left_ms / 1000 + 0.01)
        card = random.choice(running)
        routed = msgspec.structs.replace(task, to_agent=card.agent_id, ttl_ms=left_ms)
        candidates = sorted(c.agent_id for c in running)
        subject = self._broker.names.dispatch(card.agent_id, task.priority)
        headers = h.task_headers(routed, msg_id=f"{task.message_id}-{task.attempt}")
        # The event first: a trace must never show an agent at work before the routing.
        routed_event = event_for(routed, "routed", agent_id=card.agent_id, candidates=candidates)
        await emit(self._broker, routed_event)
        await self._broker.publish(subject, envelopes.encode(routed), headers=headers)
        log.debug("routed", agent_id=card.agent_id, attempt=task.attempt)
        return None

    async def end(self, task: Task, reason: str, message: str) -> None:
        """End ``task`` for good as ``reason`` (not retryable)."""
        error = ErrorInfo(type=reason, message=message, retryable=False)
        await end_with_error(self._broker, task, reason, error)
