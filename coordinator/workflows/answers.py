"""What a workflow instance's starter is told when it ends, or when it sends the starting
message again after the end; and who may cancel an instance."""

from __future__ import annotations

import msgspec
import structlog

from agentreach.broker import Broker
from agentreach.broker.lifecycle import about, reply
from agentreach.coordinator.delivery.dead_letters import end_with_error, error_reply
from agentreach.coordinator.workflows.saga import final_error
from agentreach.envelopes import ErrorInfo, Result, Task, WorkflowRecord
from agentreach.envelopes.audit import summary_of_task

log = structlog.get_logger("coordinator.workflows")


async def answer(broker: Broker, record: WorkflowRecord) -> None:
    """Tell the starter of ``record``, which just ended, how it ended (and dead-letter it
    when it failed)."""
    task = record.task
    if record.status == "completed":
        await reply(broker, task, Result(**about(task, result=record.result)))
        return
    error, ran = _error_of(record), record.steps_began
    if record.status == "cancelled":
        await reply(broker, task, error_reply(task, error, "cancelled", ran=ran))
        return
    state = msgspec.to_builtins(record)
    await end_with_error(broker, task, _ended_as(record, error), error, state=state, ran=ran)


async def refused_as_taken(broker: Broker, record: WorkflowRecord, task: Task) -> bool:
    """Whether ``task``, under the id of ``record``'s instance, is not its start sent again
    but another message (another caller's, or another workflow's start): it is told the id
    is taken (``duplicate_id``), and nothing else is done. It is not dead-lettered: its
    letter would be under the instance's id, an ending of that instance."""
    if task.caller != record.task.caller:
        message = f"message id {task.message_id!r} is another caller's message"
    elif task.topic != record.workflow:
        message = (
            f"message id {task.message_id!r} is an instance of workflow {record.workflow!r},"
            f" not {task.topic!r}: send it under an id of its own"
        )
    elif (differs := _other_payload(record.task, task)) is not None:
        # Past the duplicate window it was answered with the first start's result (a trial).
        message = (
            f"message id {task.message_id!r} started workflow {record.workflow!r} with another"
            f" payload ({differs}): send this one under an id of its own"
        )
    else:
        return False
    error = ErrorInfo(type="duplicate_id", message=message, retryable=False)
    await reply(broker, task, error_reply(task, error, "duplicate_id"))
    log.warning("workflow start refused: its id is taken", error=message)
    return True


async def answer_again(broker: Broker, record: WorkflowRecord, task: Task) -> None:
    """Answer ``task``, a start of an instance that ended already, with how it ended."""
    if record.status == "completed":
        await reply(broker, task, Result(**about(task, result=record.result)))
    else:
        error, ran = _error_of(record), record.steps_began
        await reply(broker, task, error_reply(task, error, _ended_as(record, error), ran=ran))
    log.info("workflow ended already; answered again", instance_id=record.instance_id)


def _other_payload(first: Task, again: Task) -> str | None:
    """How ``again``'s payload differs from the one ``first`` started the instance with; None
    when it does not, or when one is inline and the other stowed (not compared)."""
    if (first.payload_ref is None) != (again.payload_ref is None):
        return None
    was, now = summary_of_task(first).sha256, summary_of_task(again).sha256
    return None if was == now else f"SHA-256 {was[:12]}…, this one's {now[:12]}…"


def may_act(record: WorkflowRecord, asker: str | None) -> bool:
    """Whether a cancel or a signal sent by ``asker`` (the sender token of its subject; None
    for an operator's bare subject) may act on ``record``: a caller acts only on what it
    started."""
    return asker is None or asker == record.task.caller


def cancelled_by(asker: str | None, why: str, default: str) -> str:
    """The message of a cancel's error: the reason given (``why``, else ``default``); a
    caller's names the caller, so that nobody reads it as an operator's."""
    if asker is None:
        return why or default
    by = f"cancelled by its caller {asker!r}"
    return f"{by}: {why}" if why else by


def _error_of(record: WorkflowRecord) -> ErrorInfo:
    """The error ``record`` ended with; never retryable (records written before that rule
    said otherwise of cancels and timeouts)."""
    fallback = ErrorInfo(type="failed", message=f"workflow {record.status}")
    return final_error(record.error or fallback)


def _ended_as(record: WorkflowRecord, error: ErrorInfo) -> str:
    """How a workflow that did not complete ended: its dead-letter reason, or cancelled."""
    if record.status == "cancelled":
        return "cancelled"
    return "expired" if error.type == "expired" else "workflow_failed"
