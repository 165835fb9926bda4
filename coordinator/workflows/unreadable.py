"""A workflow message that cannot be read: its dead letter, saying what was wrong."""

from __future__ import annotations

import structlog

from agentreach.broker import Broker, Delivery
from agentreach.broker.dead_letters import dead_letter_delivery
from agentreach.coordinator.protection.server_answers import ServerAnswers
from agentreach.envelopes import DecodeError, ErrorInfo, is_token

log = structlog.get_logger("coordinator.workflows")

WORKFLOW_TOPIC = "_workflow"  # the topic of dead letters about workflow messages


async def refuse(
    broker: Broker,
    msg: Delivery,
    instance_id: str,
    exc: DecodeError,
    server_answers: ServerAnswers,
) -> None:
    """Dead-letter ``msg``, saying what ``exc`` says was wrong with it; a server's answer
    someone aimed at the subject, or an unreadable reply of an agent's, one a minute (see
    :class:`ServerAnswers`): any agent may reply under any instance id, and wrote 300 letters
    of junk in a security trial, 20 of them a megabyte each."""
    names = broker.names
    after = msg.subject.removeprefix(names.workflow_reply(""))  # <id>.<sender> when signed
    signed = names.workflow_replies(msg.subject) and "." in after
    by = names.sender_of(msg.subject) if signed else ""
    if (said := server_answers.judged(exc, msg, "workflow replies", headed=True, by=by)) is None:
        return
    exc = said
    log.error("unreadable workflow message", subject=msg.subject, error=str(exc))
    await dead_letter_delivery(
        broker,
        msg,
        reason="invalid_envelope",
        error=ErrorInfo(type="invalid_envelope", message=str(exc), retryable=False),
        topic=WORKFLOW_TOPIC,
        trace_id=instance_id if is_token(instance_id) else None,
    )
