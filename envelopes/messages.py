"""Envelope v1: every message between agents, the coordinator and workers.

One frozen base, tagged by ``kind`` so each type keeps a stable wire name. New
fields only ever arrive with defaults and unknown fields are ignored, so older
readers keep working (msgspec's schema-evolution rules).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

Priority = Literal["P0", "P1", "P2"]
PRIORITIES: tuple[Priority, ...] = ("P0", "P1", "P2")

# Ids and topics become subject tokens (reach.task.<topic>, reach.event.….<message_id>),
# so they may not hold dots, wildcards or white space.
TOKEN_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
Token = Annotated[str, msgspec.Meta(pattern=TOKEN_PATTERN, description="subject-safe token")]
_TOKEN = re.compile(TOKEN_PATTERN)
MAX_TTL_MS = 86_400_000  # a day: past that, a task is history, not work
PositiveMs = Annotated[
    int, msgspec.Meta(gt=0, le=MAX_TTL_MS, description="milliseconds, at most a day")
]
# Where replies may go: one literal NATS subject, not a system one ($JS…, $SYS…). No
# look-ahead: the pattern is published in the JSON Schema, and RE2 (Go, Rust) has none.
REPLY_PATTERN = r"^[^.\s*>$][^.\s*>]*(\.[^.\s*>]+)*$"
_REPLY = re.compile(REPLY_PATTERN)
MAX_REPLY_SUBJECT = 256
ReplySubject = Annotated[
    str,
    msgspec.Meta(pattern=REPLY_PATTERN, max_length=MAX_REPLY_SUBJECT, description="a NATS subject"),
]

DEFAULT_TTL_MS = 30_000
# The topic of the dead letters of what is no envelope at all (nothing names a topic then).
INVALID_TOPIC = "_invalid"
DEFAULT_PRIORITY: Priority = "P1"


def is_reply_subject(value: object) -> bool:
    """Whether ``value`` is a subject replies may be sent to (a literal, non-system one)."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_REPLY_SUBJECT
        and _REPLY.match(value) is not None
    )


def is_token(value: object) -> bool:
    """Whether ``value`` may stand as one token of a subject (an id, a topic)."""
    return isinstance(value, str) and _TOKEN.match(value) is not None


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """Timeout budget in ms, passed on (reduced by what was spent) to downstream tasks."""

    seek_ms: PositiveMs = 1_000
    ack_ms: PositiveMs = 2_000
    execute_ms: PositiveMs = 30_000


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent can still take, sent with its ``ack``."""

    free_slots: int
    est_latency_ms: int = 0


class PayloadRef(msgspec.Struct, frozen=True, kw_only=True):
    """Where a payload or result too large to travel inline is kept (a claim check): an
    object in the JetStream Object Store, with its size and SHA-256 to check it by."""

    bucket: str
    name: str
    size: int
    sha256: str


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Why something failed. ``retryable`` false means: do not try again; ``retry_after_ms``,
    when given, is how long to wait before trying (a quota refills by then)."""

    type: str
    message: str
    retryable: bool = True
    retry_after_ms: int | None = None


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One intent a request's text may mean, with the calibrated probability that it does."""

    intent: str
    confidence: float
    evidence: float = 0.0  # the scorer's raw match strength, before calibration


class Resolution(msgspec.Struct, frozen=True, kw_only=True):
    """How the coordinator found a task's intent from its text (intent resolution): the best
    candidate and the runner-up, among the intents of every live agent."""

    topic: str  # what the task was published on: ``auto``, or a topic nobody serves
    scorer: str
    best: Candidate | None = None
    runner_up: Candidate | None = None
    note: str = ""  # why there is no candidate (no text, no intent described)

    @property
    def confidence(self) -> float:
        """The best candidate's confidence; 0 without one."""
        return self.best.confidence if self.best else 0.0


class _Base(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    v: Literal[1]


class _AboutTask(_Base, frozen=True, kw_only=True):
    """Fields shared by a task and everything said about it (replies, events)."""

    message_id: Token
    trace_id: Token
    topic: Token
    from_agent: str | None = None
    to_agent: str | None = None
    attempt: Annotated[int, msgspec.Meta(ge=1)] = 1
    created_at: int = 0


class Task(_AboutTask, frozen=True, kw_only=True, tag="task"):
    """Work for the agent that serves ``topic``."""

    payload: Any = None
    ttl_ms: PositiveMs = DEFAULT_TTL_MS
    reply_to: ReplySubject | None = None
    priority: Priority = DEFAULT_PRIORITY
    budget: Budget = Budget()
    replay_of: str | None = None  # the dead-lettered message_id this task replays
    # How many replays led to this task: 0 for a task first sent, the replayed task's + 1
    # for a replay. A replay of a task replayed ``max_replays`` times is refused unless forced.
    replays: Annotated[int, msgspec.Meta(ge=0)] = 0
    # How many of the attempts before this one were moved, unclaimed, from an agent that went
    # away: they never ran, so they do not count against the topic's attempts.
    requeued: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Who sent it: the sender token of its intake subject, set by the coordinator (a body's
    # own claim is replaced); None for the bare operators' form.
    caller: Token | None = None
    # The intake message's own headers (not Nats-*/Reach-*), kept for routing rules.
    headers: dict[str, str] = {}
    # The broker's time of storing the task in intake (ms): reach latency counts from it.
    received_ms: int = 0
    traceparent: str | None = None  # W3C trace context, passed on to every step
    payload_ref: PayloadRef | None = None  # set instead of ``payload`` when it was too large
    # Set when the coordinator chose ``topic`` from the payload's text, not the sender.
    resolution: Resolution | None = None

    @property
    def confidence(self) -> float:
        """How sure the coordinator is of ``topic``: 1 when the sender named it, the
        resolution's confidence when it was found from the text."""
        return 1.0 if self.resolution is None else self.resolution.confidence

    @property
    def attempts_run(self) -> int:
        """The attempts that ran (or may have), up to this one: a move that took an attempt
        from its agent before it claimed it is not one of them."""
        return self.attempt - self.requeued


class Ack(_AboutTask, frozen=True, kw_only=True, tag="ack"):
    """The agent accepted the task (phase one of the two-phase ACK)."""

    capacity: Capacity | None = None


class Progress(_AboutTask, frozen=True, kw_only=True, tag="progress"):
    """The agent is still working on the task."""

    note: str = ""


class Result(_AboutTask, frozen=True, kw_only=True, tag="result"):
    """The task completed; ``result`` is the handler's return value."""

    result: Any = None
    result_ref: PayloadRef | None = None  # set instead of ``result`` when it was too large


class ErrorReply(_AboutTask, frozen=True, kw_only=True, tag="error"):
    """The task failed, for good: the coordinator sends it once the message has ended.

    ``reason`` says how it ended: the dead-letter reason (``retries_exhausted``, ``expired``,
    ``rejected``, ``no_route``, …), ``refused`` for a refusal that leaves no dead letter (a
    caller over its quota), ``cancelled`` for a cancelled workflow, ``duplicate_id`` for
    another caller's id. ``error`` is the last error itself: after retries, the agent's, whose
    ``retryable`` is the agent's verdict on that attempt, not on sending it again."""

    error: ErrorInfo
    reason: str | None = None  # None: from a coordinator older than this field
    # Whether work began for it, when the coordinator knows: a workflow says true once it
    # dispatched a step, false when it ended before any. None: not said (a task's acks and
    # events tell its caller whether an agent accepted it).
    ran: bool | None = None
    # The attempts that ran, for an ending after attempts (a dead letter's ``attempts``):
    # ``attempt`` less the moves that cost none (``requeued``). None: not said.
    attempts: int | None = None


class Routed(_AboutTask, frozen=True, kw_only=True, tag="routed"):
    """The coordinator tells the sender which agent has this attempt: replies from any
    other agent are not about this task."""

    agent_id: Token


Reply = Ack | Progress | Result | ErrorReply | Routed


class Event(_AboutTask, frozen=True, kw_only=True, tag="event"):
    """One step in a message's life, published to ``REACH_EVENTS``.

    ``event`` names the step (received, routed, accepted, completed, failed,
    dead_lettered, …); ``at_ms`` is the publisher's clock and only informational:
    order comes from the stream.
    """

    event: str
    agent_id: str | None = None
    caller: Token | None = None  # who sent the task (its intake subject's sender)
    at_ms: int = 0
    detail: dict[str, Any] = {}
    priority: Priority = DEFAULT_PRIORITY  # the task's
    received_ms: int = 0  # the task's intake time on the broker's clock (0: not known)


class WorkflowStep(msgspec.Struct, frozen=True, kw_only=True):
    """The workflow instance a dead-lettered task is a step of (``DeadLetter.workflow``).

    ``handled``: the workflow accounts for this failure, so a worker need not act on this
    letter. Either it absorbed the failure (a branch's ``on_timeout: partial`` or fallback, a
    state's ``on_error``, a branch a join may do without, a step it no longer waited for) or
    the failure ended it, and its own letter (``workflow_failed`` or ``expired``, with the
    whole record) is the one to act on, once. A compensating task's letter is never
    handled: an undo that failed leaves a completed step's effect in place."""

    instance_id: str
    step: str
    compensation: bool = False  # it undoes a completed step (a saga's compensating intent)
    handled: bool = True


# The error type of a handler that failed because a task it sent failed: its dependency's
# health, not its own (the coordinator does not count it against the agent's breakers).
SUB_TASK_FAILED = "sub_task_failed"

# The reasons the coordinator dead-letters with (a routing rule's `dlq:` may name others).
DEAD_LETTER_REASONS = (
    "expired",
    "retries_exhausted",
    "no_route",
    "rejected",
    "invalid_envelope",
    "workflow_failed",
    "poison",
)


class DeadLetter(_Base, frozen=True, kw_only=True, tag="dead_letter"):
    """A message that will not complete, with everything a worker needs to act.

    ``envelope`` is the task when it could be decoded; otherwise ``raw`` holds
    the body as received (text, or ``base64:`` + base64 for non-UTF-8 bytes)
    and ``headers`` the headers it came with.
    """

    reason: str
    message_id: str
    trace_id: str
    topic: str
    attempts: int = 0  # the attempts that ran: the envelope's attempt less its requeued
    envelope: Task | None = None
    raw: str | None = None
    headers: dict[str, str] = {}
    error: ErrorInfo | None = None
    trace: list[Event] = []
    at_ms: int = 0
    state: Any = None  # workflow_failed: the workflow's whole coordination record
    truncated: bool = False  # parts left out to fit the server's largest message
    workflow: WorkflowStep | None = None  # the task is a workflow's step

    @property
    def replays(self) -> int:
        """How many replays led to the dead-lettered task (its ``replays``; 0 without one)."""
        return self.envelope.replays if self.envelope is not None else 0


Message = Task | Ack | Progress | Result | ErrorReply | Routed | Event | DeadLetter
