"""What a signal no state of its instance waits for comes to: an event its sender can read."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import msgspec
import structlog

from agentreach.broker import Broker, BrokerError, Delivery
from agentreach.broker.direct import messages_on
from agentreach.broker.lifecycle import emit, event_for, event_message
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import ErrorInfo, Task, WorkflowRecord
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.workflows")

# A signal or cancel of an instance not started yet is looked at again this often, the
# first after NOT_STARTED_LOOK_S and each twice as far as the one before (about 15 s in all:
# a start that waits longer in the intake than that is not expected). Every 0.5 s, a
# caller's 5,000 signals to no instance were 150,000 deliveries, before every workflow's
# replies, timers and signals (a security re-test).
NOT_STARTED_LOOKS = 6
NOT_STARTED_LOOK_S = 0.5
_DROPPED_SAID = RepeatedLines(60.0, burst=5)
NO_INSTANCE_TOLD_PER_MINUTE = 5  # per sender: a flood of them does not flood REACH_EVENTS
WORKFLOW_TOPIC = "_workflow"  # the topic of an event about an instance id that names none
_NO_INSTANCE_TOLD = RepeatedLines(60.0, burst=NO_INSTANCE_TOLD_PER_MINUTE)


async def look_again(broker: Broker, msg: Delivery, kind: str, about: str) -> float | None:
    """A signal or cancel of no instance (``about``: its subject from the instance id on):
    its start may still wait in the intake (a caller that signals at once after its
    publish), so it is looked at again for a while, and counts as stored then; after that
    it is dropped, said in the log once and in the id's trace (:func:`no_instance`)."""
    instance_id = about.partition(".")[0]
    if msg.num_delivered < NOT_STARTED_LOOKS:
        return NOT_STARTED_LOOK_S * 2 ** (msg.num_delivered - 1)
    if (unsaid := _DROPPED_SAID.due(kind)) is not None:  # not a line each (a drill: 1,500)
        more = {"more_not_said": unsaid} if unsaid else {}
        log.warning(f"{kind} of no workflow instance; dropped", instance_id=instance_id, **more)
    await no_instance(broker, msg, kind, about)
    return None


async def _recorded(broker: Broker, some_id: str) -> bool:
    """Whether any event names ``some_id`` as its message or trace id (True when unknown)."""
    names = broker.names
    try:
        for subject in (names.events_of_trace(some_id), names.events_of_message(some_id)):
            if await messages_on(broker, names.events_stream, subject, limit=1):
                return True
    except BrokerError:
        return True
    return False


async def no_instance(broker: Broker, msg: Delivery, kind: str, about: str) -> None:
    """Record, in the trace of the id it named, that a signal (``signal_ignored``) or cancel
    (``cancel_refused``) found no instance: a mistyped id on the raw subject vanished with a
    log line alone, and `reach trace ID` said no event was recorded (a trial). A few a
    minute per sender, and only under an id nothing is recorded of: not in the trace of
    another caller's message (a review)."""
    instance_id, _, rest = about.partition(".")
    signal, _, asker = rest.partition(".") if kind == "signal" else ("", "", rest)
    if _NO_INSTANCE_TOLD.due(asker) is None or await _recorded(broker, instance_id):
        return
    error = ErrorInfo(
        type="no_instance",
        message=(
            f"no workflow instance {instance_id!r}: none was started under that id (a mistyped"
            f" id?), or its record is gone, 7 days after it ended; the {kind} was dropped"
        ),
        retryable=False,
    )
    detail: dict[str, object] = {"error": msgspec.to_builtins(error)}
    if signal:
        event, detail = "signal_ignored", detail | {"signal": signal, "signal_seq": msg.stream_seq}
    else:
        event, detail = "cancel_refused", detail | {"cancel_seq": msg.stream_seq}
    if asker:
        detail["by"] = asker
    about_id = Task(v=1, message_id=instance_id, trace_id=instance_id, topic=WORKFLOW_TOPIC,
                    caller=asker or None)  # fmt: skip
    with contextlib.suppress(BrokerError):  # said in the log already
        await emit(broker, event_for(about_id, event, **detail))


class Sent(NamedTuple):
    """A signal as stored: when, its stream sequence (which its answer names, so that a
    sender tells its own signal's answer from another's of the same event), and whether it
    was delivered before."""

    at_ms: int
    seq: int
    again: bool


async def signal_ignored(
    broker: Broker,
    record: WorkflowRecord,
    spec: WorkflowSpec | None,
    event: str,
    asker: str | None,
    seq: int,
    failed: ErrorInfo | None = None,
    *,
    superseded_by: int | None = None,
) -> None:
    """Record ``signal_ignored`` about ``record``'s instance: the signal, who sent it, and
    the events its current state would take (a typo shows); or, ``failed``, the error the
    instance failed with instead of taking it; ``superseded_by``, a later signal taken
    before this one was handled (after a failure), which therefore is not."""
    ignored: dict[str, object] = {"signal": event, "workflow": record.workflow, "signal_seq": seq}
    if asker is not None:
        ignored["by"] = asker
    if superseded_by is not None:
        ignored["superseded_by"] = superseded_by
    if failed is not None:
        ignored |= {"ended": "failed", "error": msgspec.to_builtins(failed)}
    elif (waits := events_awaited(record, spec)) is not None:
        ignored |= {"state": record.current, "waits_for": waits}
    await emit(broker, event_for(record.task, "signal_ignored", **ignored))


async def taken_said(broker: Broker, record: WorkflowRecord, seq: int) -> bool:
    """Whether a ``signal_taken`` of the signal at ``seq`` is stored (an instance takes
    at most MAX_STATE_VISITS signals, so its ``signal_taken`` events are few)."""
    subject = event_message(broker, event_for(record.task, "signal_taken"))[0]
    for stored in await messages_on(broker, broker.names.events_stream, subject):
        if msgspec.json.decode(stored.data).get("detail", {}).get("signal_seq") == seq:
            return True
    return False


def events_awaited(record: WorkflowRecord, spec: WorkflowSpec | None) -> list[str] | None:
    """The events the instance's current state takes (None: not a machine in a state, or
    an instance that ended)."""
    if spec is None or spec.states is None or record.current is None or record.finished:
        return None
    state = spec.states.states.get(record.current)
    return [t.event for t in state.next if t.event] if state is not None else None
