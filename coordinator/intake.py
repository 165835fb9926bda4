"""From a message on ``reach.task.<topic>`` to a dispatched task or a dead letter."""

from __future__ import annotations

import random
import re
import time

import msgspec
import structlog
from nats.aio.msg import Msg

import envelopes
from broker import Broker
from broker.lifecycle import dead_letter, emit, event_for, reply
from coordinator.directory import AgentDirectory
from coordinator.ending import end_with_error, error_reply
from envelopes import DecodeError, ErrorInfo, Task, decode_json, stable_id, task_from_intake
from envelopes import headers as h
from envelopes.types import TOKEN_PATTERN

log = structlog.get_logger("coordinator.intake")

_TOKEN = re.compile(TOKEN_PATTERN)
INVALID_TOPIC = "_invalid"


class Intake:
    """Validates, wraps, checks expiry and routes one intake message at a time."""

    def __init__(self, broker: Broker, directory: AgentDirectory) -> None:
        self._broker = broker
        self._directory = directory

    async def handle(self, msg: Msg) -> None:
        """Decide the message's fate; the caller acknowledges it afterwards."""
        meta = msg.metadata
        received_ns = int(meta.timestamp.timestamp() * 1e9)
        topic = self._broker.names.topic_of_task_subject(msg.subject)
        fallback_id = stable_id(received_ns, meta.stream, meta.sequence.stream)
        try:
            task = task_from_intake(
                msg.data,
                msg.headers,
                topic=topic,
                received_ms=received_ns // 1_000_000,
                fallback_id=fallback_id,
            )
        except DecodeError as exc:
            await self._invalid(msg, topic, fallback_id, exc)
            return
        with structlog.contextvars.bound_contextvars(
            message_id=task.message_id, trace_id=task.trace_id, topic=task.topic
        ):
            spent_ms = time.time_ns() // 1_000_000 - received_ns // 1_000_000
            if spent_ms >= task.ttl_ms:
                await self._fail(task, "expired", f"ttl {task.ttl_ms} ms passed in intake")
                return
            await self._route(msgspec.structs.replace(task, ttl_ms=task.ttl_ms - max(spent_ms, 0)))

    async def _route(self, task: Task) -> None:
        candidates = await self._directory.serving(task.topic)
        if not candidates:
            await self._fail(task, "no_route", f"no agent serves topic {task.topic!r}")
            return
        card = random.choice(candidates)
        routed = msgspec.structs.replace(task, to_agent=card.agent_id)
        await emit(
            self._broker,
            event_for(
                routed,
                "routed",
                agent_id=card.agent_id,
                candidates=sorted(c.agent_id for c in candidates),
            ),
        )
        subject = self._broker.names.dispatch(card.agent_id, task.priority)
        headers = h.task_headers(routed, msg_id=f"{task.message_id}-{task.attempt}")
        await self._broker.publish(subject, envelopes.encode(routed), headers=headers)
        log.debug("routed", agent_id=card.agent_id)

    async def _fail(self, task: Task, reason: str, message: str) -> None:
        error = ErrorInfo(type=reason, message=message, retryable=False)
        await end_with_error(self._broker, task, reason, error)

    async def _invalid(self, msg: Msg, topic: str, fallback_id: str, exc: DecodeError) -> None:
        headers = dict(msg.headers or {})
        claimed = _claimed_ids(msg.data)
        message_id = _token_or(headers.get(h.MSG_ID) or claimed.get("message_id"), fallback_id)
        trace_id = _token_or(headers.get(h.TRACE_ID) or claimed.get("trace_id"), message_id)
        topic = _token_or(topic, INVALID_TOPIC)
        error = ErrorInfo(type="invalid_envelope", message=str(exc), retryable=False)
        log.warning("invalid envelope", message_id=message_id, subject=msg.subject, error=str(exc))
        await dead_letter(
            self._broker,
            reason="invalid_envelope",
            message_id=message_id,
            trace_id=trace_id,
            topic=topic,
            error=error,
            raw=msg.data,
            headers=headers,
        )
        stub = Task(
            v=1,
            message_id=message_id,
            trace_id=trace_id,
            topic=topic,
            reply_to=headers.get(h.REPLY_TO),
        )
        await reply(self._broker, stub, error_reply(stub, error))


def _claimed_ids(data: bytes) -> dict[str, object]:
    """The ids an invalid envelope claims, so its dead letter can be found by them."""
    try:
        document = decode_json(data)
    except DecodeError:
        return {}
    return document if isinstance(document, dict) else {}


def _token_or(value: object, fallback: str) -> str:
    return value if isinstance(value, str) and _TOKEN.match(value) else fallback
