"""A caller's signals and cancels are charged to its quota, a token each, as its tasks are.

A signal may move a state machine on to its next step, a task the caller's quota never
sees, and every signal or cancel costs a read and a write of the instance's record: without
a charge, a caller held to 5 tasks a second could signal a looping machine into running
steps as fast as the coordinator writes. Operators' (the bare subjects) are not charged; a
caller's is, once, on its first delivery. Over its quota, a signal or cancel is not acted on
(delivered again, it stays refused), and its sender
hears why in an event about the instance (``signal_ignored`` or ``cancel_refused``, with a
``rate_limited`` error saying when to send it again) — when the instance is its own: of
another's, or of none, it hears nothing, as of a signal it may not send."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

from agentreach.broker import Broker, Bucket, Delivery
from agentreach.broker.lifecycle import emit, event_for, events_of
from agentreach.coordinator.protection.quotas import CallerQuotas, OverQuota
from agentreach.coordinator.workflows.answers import may_act
from agentreach.envelopes import ErrorInfo, Event, WorkflowRecord

log = structlog.get_logger("coordinator.workflows")

Records = Callable[[], Awaitable[Bucket[WorkflowRecord]]]


class ControlCharges:
    """Charges a caller's signal or cancel to its quota; answers one over it."""

    def __init__(self, broker: Broker, quotas: CallerQuotas | None, records: Records) -> None:
        self._broker = broker
        self._quotas = quotas
        self._records = records

    async def refused(self, kind: str, about: str, msg: Delivery) -> bool:
        """Whether the ``kind`` message (``signal`` or ``cancel``; ``about``, its subject
        from the instance id on) was refused for its sender's quota, and answered."""
        instance_id, _, rest = about.partition(".")
        signal, _, asker = rest.partition(".") if kind == "signal" else ("", "", rest)
        if self._quotas is None or not asker or not self._quotas.limits(asker):
            return False
        if msg.num_delivered > 1:  # charged once: refused then, it stays refused
            return await self._refused_before(instance_id, msg.stream_seq)
        over = await self._quotas.admit(asker)
        if over is None:
            return False
        entry = await (await self._records()).get(instance_id)
        if entry is None or not may_act(entry.value, asker):
            log.warning(
                f"{kind} refused: its caller is over its quota (and the instance is not its own)",
                instance_id=instance_id,
                caller=asker,
            )
            return True
        said: dict[str, Any]
        if signal:
            event, said = "signal_ignored", {"signal": signal, "signal_seq": msg.stream_seq}
        else:
            event, said = "cancel_refused", {"cancel_seq": msg.stream_seq}
        said |= _refusal(entry.value, over)
        await emit(self._broker, event_for(entry.value.task, event, **said))
        log.info(f"{kind} refused: its caller is over its quota", instance_id=instance_id)
        return True

    async def _refused_before(self, instance_id: str, seq: int) -> bool:
        """Whether the signal or cancel stored at ``seq`` was refused on an earlier delivery
        (its answer stored, the coordinator gone before the acknowledgement): its caller was
        told it was not acted on, and may send it again; acted on now, it would be twice."""
        if (entry := await (await self._records()).get(instance_id)) is None:
            return False
        stored = await events_of(self._broker, entry.value.task.trace_id, instance_id)
        return any(_refuses(event, seq) for _, event in stored.authentic)


def _refuses(event: Event, seq: int) -> bool:
    """Whether ``event`` is the quota refusal of the signal or cancel stored at ``seq``."""
    seq_key = {"signal_ignored": "signal_seq", "cancel_refused": "cancel_seq"}.get(event.event)
    error = event.detail.get("error")
    over = isinstance(error, dict) and error.get("type") == "rate_limited"
    return seq_key is not None and over and event.detail.get(seq_key) == seq


def _refusal(record: WorkflowRecord, over: OverQuota) -> dict[str, Any]:
    """What both answers say: whose, of which workflow, and the quota's error."""
    limit = over.limit
    error = ErrorInfo(
        type="rate_limited",
        message=(
            f"caller {over.caller!r} is over its quota {over.quota!r} ({limit.rate:g}/s,"
            f" burst {limit.burst}), which signals and cancels are charged to as tasks are;"
            f" not acted on: send it again in {over.retry_after_ms} ms"
        ),
        retryable=True,
        retry_after_ms=over.retry_after_ms,
    )
    return {"workflow": record.workflow, "by": over.caller, "error": msgspec.to_builtins(error)}
