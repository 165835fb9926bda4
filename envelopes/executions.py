"""Run-once records in KV ``reach_executions``: an agent's claim on a message and its outcome."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentreach.envelopes.messages import ErrorInfo, PayloadRef


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's record of running one message, in ``reach_executions`` under
    ``<caller>.<message_id>.<agent_id>`` (``_`` for no caller; each agent writes only its own).

    ``running`` holds a lease: until ``lease_until_ms`` no other delivery of the
    message may run it. ``done`` keeps the result, so a redelivery or a republish
    gets it again without running twice. ``failed`` lets the next attempt run.
    """

    v: Literal[1] = 1
    message_id: str
    state: Literal["running", "done", "failed"]
    agent_id: str
    epoch: int = 0
    attempt: int = 1
    lease_until_ms: int = 0
    # When this attempt's run began (the agent's clock): a delivery that takes a crashed
    # run's claim over keeps it, and runs for what is left of the execute budget from then.
    started_ms: int = 0
    result: Any = None
    result_ref: PayloadRef | None = None  # a result kept in the Object Store
    error: ErrorInfo | None = None
    finished_at_ms: int = 0
    caller: str | None = None  # the task's sender: a stored result answers only that sender
    # The dispatch's ``Reach-Seal``, copied: on a secured deployment the coordinator trusts
    # only records it sealed (no agent can write another's outcome for a message).
    seal: str | None = None
    # The task's ``received_ms``: which life of the message (one sent again past the intake's
    # duplicate window is another) the record is of. A failed attempt of this life is not
    # run again; another life's failure blocks nothing (0: not known, an older agent's).
    received_ms: int = 0


NO_CALLER = "_"  # the caller token of a task sent in the bare operators' form


def execution_key(caller: str | None, message_id: str, agent_id: str) -> str:
    """The key of ``agent_id``'s record of ``caller``'s ``message_id`` in
    ``reach_executions``: one caller's id never meets another's record, and an agent may
    write only keys that end in its own id."""
    return f"{caller or NO_CALLER}.{message_id}.{agent_id}"


def executions_of(caller: str | None, message_id: str) -> str:
    """The keys of every agent's record of ``caller``'s ``message_id`` (a KV pattern)."""
    return f"{caller or NO_CALLER}.{message_id}.*"


def executions_of_any_caller(message_id: str) -> str:
    """The keys of every agent's record of ``message_id``, whoever sent it (a KV pattern)."""
    return f"*.{message_id}.*"


REASSIGNED = "reassigned"  # the error of a record whose attempt was moved to another agent


def is_reassignment_fence(record: Execution, attempt: int) -> bool:
    """Whether ``record`` says ``attempt`` was taken from its agent (judged gone, its queue
    moved to another agent as the next attempt): no process of that agent may run it, not
    even one that comes back and fetches it from its durable queue before it is deleted."""
    return (
        record.state == "failed"
        and record.attempt == attempt
        and record.error is not None
        and record.error.type == REASSIGNED
    )


def moved_on_from(record: Execution, attempt: int) -> bool:
    """Whether ``record`` fences ``attempt`` off from its agent: a reassignment fence of that
    attempt or a later one. The agent's one record of the message keeps the last fence, so a
    fence of attempt 3 replaced that of 2, and a process that came back and fetched attempt 2
    before its deletion ran it beside attempt 3 (a cluster walkthrough)."""
    return record.attempt >= attempt and is_reassignment_fence(record, record.attempt)


def is_expiry_fence(record: Execution, attempt: int) -> bool:
    """Whether ``record`` ends ``attempt`` as expired: the *expiry fence* the coordinator
    wrote as it ended the task (on its agent's ``expired`` report, at its pass over the
    queues, or for an attempt never reported); agents write none. No delivery of that
    attempt may be claimed over it."""
    return (
        record.state == "failed"
        and record.attempt == attempt
        and record.error is not None
        and record.error.type == "expired"
    )
