"""A caller's signals and cancels are charged to its quota, a token each, as its tasks are.

A signal may move a state machine on to its next step, a task the caller's quota never
sees, and every signal or cancel costs a read and a write of the instance's record: without
a charge, a caller held to 5 tasks a second could signal a looping machine into running
steps as fast as the coordinator writes. Operators' (the bare subjects) are not charged; a
caller's is, once, on its first delivery. Over its quota, a signal or cancel is not acted on
(and its acknowledgement applied first, so that it never comes back to be), and its sender
hears why in an event about the instance (``signal_ignored`` or ``cancel_refused``, with a
``rate_limited`` error saying when to send it again) — when the instance is its own: of
another's, or of none, it hears nothing, as of a signal it may not send."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

from agentreach.broker import Broker, Bucket, Delivery
from agentreach.broker.lifecycle import emit, event_for
from agentreach.coordinator.protection.quotas import CallerQuotas, OverQuota
from agentreach.coordinator.workflows.answers import may_act
from agentreach.envelopes import ErrorInfo, WorkflowRecord
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.workflows")

SAID_PER_MINUTE = 5  # refusals logged per caller and kind of line

Records = Callable[[], Awaitable[Bucket[WorkflowRecord]]]


class ControlCharges:
    """Charges a caller's signal or cancel to its quota; answers one over it."""

    def __init__(self, broker: Broker, quotas: CallerQuotas | None, records: Records) -> None:
        self._broker = broker
        self._quotas = quotas
        self._records = records
        self._said = RepeatedLines(60.0, burst=SAID_PER_MINUTE)  # a flood is not a log line each

    async def refused(self, kind: str, about: str, msg: Delivery) -> bool:
        """Whether the ``kind`` message (``signal`` or ``cancel``; ``about``, its subject
        from the instance id on) was refused for its sender's quota, and answered."""
        instance_id, _, rest = about.partition(".")
        signal, _, asker = rest.partition(".") if kind == "signal" else ("", "", rest)
        if self._quotas is None or not asker or not self._quotas.limits(asker):
            return False
        if msg.num_delivered > 1:  # charged once (one refused then is gone: see settled)
            return False
        over = await self._quotas.admit(asker)
        if over is None:
            return False
        await settled(msg)  # before its answer: it never comes back to be taken
        entry = await (await self._records()).get(instance_id)
        if entry is None or not may_act(entry.value, asker):
            line = f"{kind} refused: its caller is over its quota (the instance is not its own)"
            self._say(line, instance_id, asker)
            return True
        said: dict[str, Any]
        if signal:
            event, said = "signal_ignored", {"signal": signal, "signal_seq": msg.stream_seq}
        else:
            event, said = "cancel_refused", {"cancel_seq": msg.stream_seq}
        said |= _refusal(entry.value, over)
        await emit(self._broker, event_for(entry.value.task, event, **said))
        self._say(f"{kind} refused: its caller is over its quota", instance_id, asker)
        return True

    def _say(self, line: str, instance_id: str, caller: str) -> None:
        """The line, a few times a minute per caller, with how many went unsaid since."""
        if (unsaid := self._said.due(f"{caller} {line}")) is not None:
            more = {"more_not_said": unsaid} if unsaid else {}
            log.warning(line, caller=caller, instance_id=instance_id, **more)


async def settled(msg: Delivery) -> None:
    """Acknowledge a signal or cancel acted on (or refused), and wait for the server to have
    applied that: a server that dies before it applies an acknowledgement (a flood's are
    many) delivers the message again, as new, and a refused signal was taken so after a
    restart, one taken would be taken twice. Its stream is a work queue: once the
    acknowledgement is applied, the message is gone."""
    await msg.ack_applied()


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
