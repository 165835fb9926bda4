"""The ``detail`` of each lifecycle event whose shape is fixed.

An :class:`~agentreach.envelopes.messages.Event` carries ``detail``, an object whose keys
depend on ``event``. The shapes below are part of the wire contract: agents publish the
first group (and the coordinator acts on ``completed``, ``failed`` and ``expired``; a
``failed`` about a dispatch that was no task has :class:`UndecodableDetail`), the
coordinator publishes the second. Unknown keys are ignored, like unknown fields anywhere,
so a publisher may add keys; it may not leave out or retype the ones listed here.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from agentreach.envelopes.codec import decode_as, encode
from agentreach.envelopes.errors import DecodeError
from agentreach.envelopes.messages import ErrorInfo, Event, PayloadRef, Task
from agentreach.envelopes.registry import LivenessState

NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class _Detail(msgspec.Struct, frozen=True, kw_only=True):
    pass


# -- published by agents ---------------------------------------------------------------
class _AboutGrantedTask(_Detail, frozen=True, kw_only=True):
    # The dispatch's Reach-Grant header, echoed in every event an agent publishes about the
    # task (absent when the dispatch had none: a deployment without a seal key).
    grant: str | None = None


class AcceptedDetail(_AboutGrantedTask, frozen=True, kw_only=True):
    """``accepted``: the agent took the task (it sent its ``ack``); the broker time of the
    dispatch, for the time the task waited in the agent's queue; the epoch of the process
    that took it (0: not said), so that a process started again on the same attempt shows
    as a second ``accepted`` in the trace."""

    dispatched_at_ms: NonNegative = 0
    epoch: NonNegative = 0


class ProgressDetail(_AboutGrantedTask, frozen=True, kw_only=True):
    """``progress``: the handler reported progress."""

    note: str


class CompletedDetail(_AboutGrantedTask, frozen=True, kw_only=True):
    """``completed``: the result was recorded and sent (``duration_ms`` 0 when a duplicate
    delivery was answered from the execution record). A result too large to travel is in the
    Object Store: then ``result_ref`` names it instead of ``result``. ``past_deadline_ms``:
    the handler's deadline, when work that could not be stopped (a thread) ran past it and
    its result, late, stands."""

    result: Any = None
    result_ref: PayloadRef | None = None
    duration_ms: NonNegative
    past_deadline_ms: NonNegative | None = None


class OutcomeDetail(_AboutGrantedTask, frozen=True, kw_only=True):
    """``failed`` and ``expired``: the whole task as received (the coordinator builds the
    retry from it), why, and the broker time of the dispatch (for the ttl left)."""

    task: Task
    error: ErrorInfo
    dispatched_at_ms: NonNegative = 0


class UndecodableDetail(_Detail, frozen=True, kw_only=True):
    """``failed`` about a dispatch that was no task (topic ``_invalid``, a message id the
    agent derived from the stream and sequence): its bytes and headers, and why; the
    coordinator dead-letters it as ``invalid_envelope``."""

    error: ErrorInfo
    raw: str  # the body as text, or "base64:" + base64 when it is not UTF-8
    headers: dict[str, str] = {}
    # raw cut to its first 65,536 characters (code points) and "…": the report must fit a message
    truncated: bool = False


class LateResultRejectedDetail(_AboutGrantedTask, frozen=True, kw_only=True):
    """``late_result_rejected``: a result lost its claim (fenced) and was not sent."""


class DeadLetteredDetail(_Detail, frozen=True, kw_only=True):
    """``dead_lettered``: the message went to ``REACH_DLQ`` with this reason."""

    reason: str
    error: ErrorInfo | None = None
    ran: bool | None = None  # as the error reply's ``ran`` says (a workflow's: a step began)
    attempts: int | None = None  # as the letter's: how many ran (0: none began)
    # A workflow step's letter its workflow accounts for (the letter's workflow.handled):
    # not a finished task of its own in the metrics, the workflow's ending is.
    handled: bool = False


class ClockDriftDetail(_Detail, frozen=True, kw_only=True):
    """``clock_drift`` (about an agent): its wall clock jumped against its monotonic one."""

    drift_s: float


# -- published by the coordinator (informative) ------------------------------------------
class RoutedDetail(_Detail, frozen=True, kw_only=True):
    """``routed``: the rule that matched, the pool chosen from, who could have taken the task
    and why the others were passed over (at most 20 of each listed)."""

    rule: str
    pool: str
    candidates: list[str]
    candidates_total: NonNegative
    passed_over: dict[str, str]
    trial: str | None = None  # the breaker whose half-open trial this call is
    ttl_ms: int | None = None  # the dispatch's: what was left of the task's ttl
    execute_ms: int | None = None  # the dispatch's execute budget
    reply_to: str | None = None  # where the task's replies go
    # Attempt 1: the topic it was sent on (a rule, or the resolution, may route it to
    # another), what a caller sending its id again compares its own with (caller.md §9).
    sent_topic: str | None = None
    # Rules passed over because a condition's value was of another type than the task's
    # (`"5000" >= 1000`): rule name → why (at most 20).
    rules_not_compared: dict[str, str] | None = None


class RetryScheduledDetail(_Detail, frozen=True, kw_only=True):
    """``retry_scheduled``: the failed attempt will be followed by ``next_attempt``."""

    next_attempt: Annotated[int, msgspec.Meta(ge=2)]
    delay_ms: NonNegative
    error: ErrorInfo


class AgentStateDetail(_Detail, frozen=True, kw_only=True):
    """``agent_state`` (about an agent): a liveness transition."""

    state: LivenessState
    was: LivenessState
    reason: str
    quarantined: bool


class AlertDetail(_Detail, frozen=True, kw_only=True):
    """``alert`` (about an agent): something an operator should look at — ``unresponsive``,
    or ``impersonation`` (an event dropped: ``why``, the agent it ``claimed``, its ``kind``
    and ``message_id``)."""

    problem: str
    why: str | None = None
    claimed: str | None = None
    kind: str | None = None
    message_id: str | None = None


class AnsweredFromRecordDetail(_Detail, frozen=True, kw_only=True):
    """``answered_from_record``: the message had finished on ``agent_id`` (the event's), and
    its stored result answered instead of a new run. No keys."""


class BreakerDetail(_Detail, frozen=True, kw_only=True):
    """``breaker_opened``, ``breaker_half_open``, ``breaker_closed`` (``intent`` set) and
    ``agent_isolated``, ``isolation_trial``, ``agent_restored`` (about a whole agent)."""

    reason: str
    isolated_agents: NonNegative
    intent: str | None = None


class RejectedDetail(_Detail, frozen=True, kw_only=True):
    """``rejected``: a task refused without a dead letter (a caller over its quota): the
    error its sender got; the refusal may add keys (``caller``, ``quota``)."""

    error: ErrorInfo


class SignalTakenDetail(_Detail, frozen=True, kw_only=True):
    """``signal_taken``: the instance's state ``state`` took the signalled ``event`` (an
    event about the instance, in its starter's trace), leaving its ``visit`` of that state;
    ``by``, the caller that sent it (absent: an operator)."""

    event: str
    state: str
    workflow: str | None = None
    visit: int | None = None
    by: str | None = None
    signal_seq: int | None = None  # the signal's sequence in REACH_WORKFLOWS: its sender's answer


class SignalIgnoredDetail(_Detail, frozen=True, kw_only=True):
    """``signal_ignored``: a workflow signal arrived that no state was waiting for; the
    instance's ``workflow``, its current ``state`` and the events that state takes
    (``waits_for``; both absent when it is in no state), and ``by``, the caller that sent it
    (absent: an operator). A signal
    whose change would not fit in the instance's record fails the instance instead: then
    ``ended`` is ``failed`` and ``error`` says why (``record_too_large``). A caller's signal
    over its quota is not looked at: ``error`` is ``rate_limited`` (with ``retry_after_ms``),
    and there is no ``ended``."""

    signal: str
    workflow: str | None = None
    state: str | None = None
    waits_for: list[str] | None = None
    by: str | None = None
    signal_seq: int | None = None  # the signal's sequence in REACH_WORKFLOWS: its sender's answer
    # A later signal of the instance, taken before this one was handled (this one was held
    # up by a failure, or is delivered again after a server crash): this one is not taken.
    superseded_by: int | None = None
    ended: str | None = None
    error: ErrorInfo | None = None


class CancelRefusedDetail(_Detail, frozen=True, kw_only=True):
    """``cancel_refused``: a caller's cancel of the instance was not acted on, ``error``
    says why (``rate_limited``: the caller is over its quota; send it again after
    ``retry_after_ms``); ``by`` the caller, ``cancel_seq`` the cancel's sequence in
    REACH_WORKFLOWS (its sender's answer)."""

    error: ErrorInfo
    workflow: str | None = None
    by: str | None = None
    cancel_seq: int | None = None


# -- published by compensation workers and operators (about a dead letter's message) -----
class ReplayedDetail(_Detail, frozen=True, kw_only=True):
    """``replayed``: the dead letter was replayed as a new message, ``replayed_as``, on
    ``topic``, ``replays`` replays having led to it; ``by`` who (a worker's name, an
    operator's identity)."""

    replayed_as: str
    topic: str
    replays: NonNegative
    by: str | None = None
    # Which letter of the message it settles (its at_ms): a later life of the id, dead-
    # lettered again, is a letter of its own. None: recorded before events said so.
    letter_at_ms: int | None = None


class ResolvedDetail(_Detail, frozen=True, kw_only=True):
    """``resolved``: a person or a worker dealt with the dead letter otherwise; ``note`` says
    how, ``by`` who."""

    note: str
    by: str | None = None
    letter_at_ms: int | None = None  # as in ReplayedDetail


WORKER_EVENTS: dict[str, type[_Detail]] = {
    "replayed": ReplayedDetail,
    "resolved": ResolvedDetail,
}
AGENT_EVENTS: dict[str, type[_Detail]] = {
    "accepted": AcceptedDetail,
    "progress": ProgressDetail,
    "completed": CompletedDetail,
    "failed": OutcomeDetail,
    "expired": OutcomeDetail,
    "late_result_rejected": LateResultRejectedDetail,
    "clock_drift": ClockDriftDetail,
}
COORDINATOR_EVENTS: dict[str, type[_Detail]] = {
    "routed": RoutedDetail,
    "retry_scheduled": RetryScheduledDetail,
    "dead_lettered": DeadLetteredDetail,
    "agent_state": AgentStateDetail,
    "alert": AlertDetail,
    **dict.fromkeys(
        (
            "breaker_opened",
            "breaker_half_open",
            "breaker_closed",
            "agent_isolated",
            "isolation_trial",
            "agent_restored",
        ),
        BreakerDetail,
    ),
    "signal_ignored": SignalIgnoredDetail,
    "signal_taken": SignalTakenDetail,
    "cancel_refused": CancelRefusedDetail,
    "answered_from_record": AnsweredFromRecordDetail,
    "rejected": RejectedDetail,
}
EVENT_DETAILS: dict[str, type[_Detail]] = {**COORDINATOR_EVENTS, **AGENT_EVENTS, **WORKER_EVENTS}


def detail_type(event: Event) -> type[_Detail] | None:
    """The type of ``event.detail`` (None for a free-form one, such as a workflow's notes)."""
    if event.event == "failed" and "raw" in event.detail and "task" not in event.detail:
        return UndecodableDetail
    return EVENT_DETAILS.get(event.event)


def decode_detail(event: Event) -> _Detail | None:
    """``event.detail`` as the type its event name fixes (None for an event whose detail is
    free-form, such as a workflow's notes); raises :class:`DecodeError` naming the path
    below ``$.detail`` when it does not fit."""
    kind = detail_type(event)
    if kind is None:
        return None
    try:
        return decode_as(encode(event.detail), kind)
    except DecodeError as exc:
        text, _, path = str(exc).partition(" - at `$")
        where = f" - at `$.detail{path}" if path else " - at `$.detail`"
        raise DecodeError(f"{event.event} event: {text}{where}") from None
