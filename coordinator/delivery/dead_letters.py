"""The one way a task ends badly: a dead letter with its reason, plus an error to its sender."""

from __future__ import annotations

from typing import Any

import structlog

from agentreach.broker import Broker
from agentreach.broker.lifecycle import about, dead_letter, reply
from agentreach.envelopes import ErrorInfo, ErrorReply, Task

log = structlog.get_logger("coordinator")


async def end_with_error(
    broker: Broker, task: Task, reason: str, error: ErrorInfo, *, state: Any = None
) -> None:
    """Dead-letter ``task`` as ``reason`` (with ``state``, if any) and send ``error`` to its
    ``reply_to``."""
    await dead_letter(
        broker,
        reason=reason,
        task=task,
        message_id=task.message_id,
        trace_id=task.trace_id,
        topic=task.topic,
        error=error,
        state=state,
    )
    log.info("dead-lettered", reason=reason, error=error.message)  # said once it is so
    await reply(broker, task, error_reply(task, error))


def error_reply(task: Task, error: ErrorInfo) -> ErrorReply:
    """The ``error`` envelope answering ``task``."""
    return ErrorReply(**about(task, error=error))
