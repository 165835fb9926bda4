"""Act on what agents report: retry a failed task, or end it in the dead-letter stream.

The backoff between attempts lives here and only here: the ``failed`` event is
negatively acknowledged with the backoff as its delay, and its redelivery
dispatches the next attempt. So the wait survives a coordinator restart, and
JetStream's own redelivery never stacks another backoff underneath.
"""

from __future__ import annotations

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, Delivery
from agentreach.broker.lifecycle import emit, event_for
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.delivery.retries import RetryConfig
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.coordinator.routing.router import Router
from agentreach.envelopes import DecodeError, ErrorInfo, Event, Task, ttl_left_ms

log = structlog.get_logger("coordinator.outcomes")

OUTCOME_EVENTS = ("failed", "expired")


class Outcomes:
    """Turns ``failed`` and ``expired`` events into retries or dead letters."""

    def __init__(
        self, broker: Broker, router: Router, directory: AgentDirectory, config: RetryConfig
    ) -> None:
        self._broker = broker
        self._router = router
        self._directory = directory
        self._config = config

    async def handle(self, msg: Delivery) -> float | None:
        """None to acknowledge the event, or seconds until it should come back."""
        try:
            event = envelopes.decode_event(msg.data)
            task = msgspec.convert(event.detail.get("task"), Task)
            error = msgspec.convert(event.detail.get("error"), ErrorInfo)
        except (DecodeError, msgspec.ValidationError) as exc:
            # Agents publish these; one that cannot be read is a bug to see, not to retry.
            log.error("unreadable outcome event", subject=msg.subject, error=str(exc))
            return None
        with structlog.contextvars.bound_contextvars(
            message_id=task.message_id, trace_id=task.trace_id, agent_id=event.agent_id
        ):
            return await self._decide(event, task, error, msg.num_delivered)

    async def _decide(
        self, event: Event, task: Task, error: ErrorInfo, delivered: int
    ) -> float | None:
        if event.event == "expired":
            await end_with_error(self._broker, task, "expired", error)
            return None
        if not error.retryable:
            await end_with_error(self._broker, task, "rejected", error)
            return None
        if task.attempt >= self._max_attempts(task, event.agent_id):
            await end_with_error(self._broker, task, "retries_exhausted", error)
            return None
        if delivered == 1:
            return await self._schedule(task, error)
        return await self._retry(event, task, waited=delivered - 2)

    async def _schedule(self, task: Task, error: ErrorInfo) -> float:
        delay = self._config.backoff_s(task.attempt)
        log.info("retry scheduled", attempt=task.attempt + 1, delay_s=round(delay, 3))
        await emit(
            self._broker,
            event_for(
                task,
                "retry_scheduled",
                next_attempt=task.attempt + 1,
                delay_ms=int(delay * 1000),
                error=error,
            ),
        )
        return delay

    async def _retry(self, event: Event, task: Task, *, waited: int) -> float | None:
        dispatched_at_ms = int(event.detail.get("dispatched_at_ms") or event.at_ms)
        left_ms = ttl_left_ms(task.ttl_ms, dispatched_at_ms)
        retry = msgspec.structs.replace(task, attempt=task.attempt + 1, to_agent=None)
        return await self._router.dispatch(
            retry, left_ms=left_ms, waited=waited, where="between retries"
        )

    def _max_attempts(self, task: Task, agent_id: str | None) -> int:
        card = self._directory.cards.get(agent_id or "")
        intent = card.intents.get(task.topic) if card else None
        return self._config.attempts_for(task.topic, intent.max_attempts if intent else None)
