"""Errors of the agent SDK, under the one root :class:`agentreach.errors.ReachError`.

ReachError
├── AgentConfigError         an Agent or handler was declared wrongly
├── InvalidArgument          a ReachClient call got a wrong argument (also a ValueError)
├── AgentIdInUse             another live process already serves this agent_id
├── PermanentError           raised by a handler: do not retry this task
├── ReplayLimitReached       a dead letter's task was replayed max_replays times already
├── LetterSettled            a dead letter was replayed or resolved already: not replayed again
├── UnknownWorkflow          cancel/signal_workflow: no instance of that id among the caller's
├── WorkflowActionRefused    cancel/signal_workflow: not acted on (``.error``: over the quota)
└── InvokeError              ReachClient.invoke() did not get a result
    ├── NotProvisioned       the task was not sent: no stream takes tasks (run `reach provision`)
    ├── BacklogFull          the task was not sent: the caller's backlog on the topic is full
    ├── NotStored            JetStream did not answer: it may have been stored (send it again by id)
    ├── NotAcknowledged      no agent accepted the task within the ack deadline (it stays queued)
    ├── DeadlineExceeded     accepted, but no result within the execute deadline
    ├── UnexpectedResult     it completed, but its result does not fit ``result_type``
    └── TaskFailed           it failed after an agent took it (``.error``)
        └── Rejected         refused before any agent took it (``.reason``: no_route, expired, …)
"""

from __future__ import annotations

from agentreach.broker import (
    Broker,
    BrokerError,
    ConnectError,
    NoStreamError,
    StreamFull,
    SubjectFull,
)
from agentreach.envelopes import ErrorInfo, Task
from agentreach.errors import ReachError


class AgentConfigError(ReachError):
    """An Agent or handler option is wrong; the message names it."""


class InvalidArgument(ReachError, ValueError):
    """An argument of a :class:`ReachClient` call breaks the envelope's rules, or its payload
    has no JSON form; ``argument`` is its name as the caller wrote it, and the message starts
    with it (``ttl_ms=0: …``). Raised before anything is sent."""

    def __init__(self, message: str, *, argument: str) -> None:
        super().__init__(message)
        self.argument = argument


class AgentIdInUse(ReachError):
    """Another live process already serves this agent_id."""


class PermanentError(ReachError):
    """Raise from a handler when trying again cannot help (bad input, business refusal)."""


class SyncCallOnLoop(PermanentError, RuntimeError):
    """A ``*_sync`` call of the task context made on the agent's event loop (from an
    ``async def`` handler): it would wait for the loop it blocks, and every handler of the
    agent would stop. Such a handler awaits the call instead (``await ctx.invoke(…)``)."""


class ReplayLimitReached(ReachError):
    """A replay refused: the dead letter's task is itself the product of ``replays``
    replays, as many as ``max_replays`` allows (a worker replaying the letters its own replays
    cause would go on without end). Nothing was published; ``force=True`` replays anyway.
    ``message_id`` is the dead letter's."""

    def __init__(self, message: str, *, message_id: str, replays: int, max_replays: int) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.replays = replays
        self.max_replays = max_replays


class NothingToReplay(ReachError):
    """A replay refused: the dead letter holds no task (an ``invalid_envelope`` letter keeps
    the body as received, ``letter.raw``, since it did not decode). No replay can help, forced
    or not: the body must be fixed and sent again, and the letter resolved. ``message_id`` is
    the dead letter's."""

    def __init__(self, message: str, *, message_id: str, reason: str) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.reason = reason


class LetterSettled(ReachError):
    """A replay refused: the dead letter was dealt with already, ``state`` ``replayed`` or
    ``resolved`` (its last ``replayed``/``resolved`` event), ``by`` whom and ``at_ms`` when
    (the event's own). Replaying it again would run its task again. Nothing was published;
    ``force=True`` replays anyway. ``message_id`` is the dead letter's."""

    def __init__(
        self, message: str, *, message_id: str, state: str, by: str | None, at_ms: int
    ) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.state = state
        self.by = by
        self.at_ms = at_ms


class UnknownWorkflow(ReachError, LookupError):
    """No workflow instance of that id among the caller's own messages."""


class WorkflowActionRefused(ReachError):
    """The coordinator did not act on a cancel or signal of the caller's instance;
    ``error`` says why (``rate_limited``: the caller is over its quota, which signals and
    cancels are charged to as tasks are). Sending it again after ``error.retry_after_ms``
    is safe: this one changed nothing."""

    def __init__(self, message: str, *, error: ErrorInfo, instance_id: str) -> None:
        super().__init__(message)
        self.error = error
        self.instance_id = instance_id


class InvokeError(ReachError):
    """An invocation ended without a result."""

    def __init__(self, message: str, *, message_id: str, trace_id: str) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.trace_id = trace_id


class NotProvisioned(InvokeError, NoStreamError):
    """The task was not sent: the server has no stream that takes tasks (it is new, or was
    wiped, and nobody ran ``reach provision`` or started a coordinator on it), or it has
    them under another prefix. Nothing runs; once provisioned, sending again is safe. (Also
    a :class:`~agentreach.broker.NoStreamError`, as it was raised before.)"""


class BacklogFull(InvokeError, SubjectFull):
    """The task was not sent: for its whole ttl the intake held as many of this caller's
    tasks on the topic as it keeps (``limits.tasks_per_subject``, 1,000 by default) that the
    coordinator had not taken (``publish`` and ``invoke`` wait for room until then: a caller
    that floods a topic goes at the pace its tasks are taken, instead of standing before
    every other caller's), or the whole intake was full (``limits.tasks_bytes``: no
    coordinator takes tasks). Nothing runs. (Also a :class:`~agentreach.broker.SubjectFull`.)"""


class NotStored(InvokeError, BrokerError):
    """JetStream did not take the task within its election budget (15 s, each write made
    again meanwhile): the server restarts, the stream's leader is being elected, most of a
    cluster's nodes are down. It may have been stored (a write whose answer was lost): send
    it again under its ``message_id``, which the stream and the agents' run-once records
    keep one message, never under a new id. (Also a :class:`~agentreach.broker.BrokerError`,
    as it was raised before.)"""


class NotAcknowledged(InvokeError):
    """No agent acknowledged the task within the ack deadline.

    The task is not withdrawn: it stays queued and may still run later, until its ttl runs
    out (the message says when no coordinator runs to route it). To try again safely,
    invoke again with the same ``message_id`` (this error's): the new call attaches to the
    first message and answers with how it ends. Never send a non-idempotent task again
    under a new id: both could run.
    """


class UnexpectedResult(InvokeError):
    """The task completed, but its result does not fit the ``result_type`` the caller gave
    (``.result`` is the result as it came). It ran: sending it again runs it again."""

    def __init__(self, message: str, *, message_id: str, trace_id: str, result: object) -> None:
        super().__init__(message, message_id=message_id, trace_id=trace_id)
        self.result = result


class DeadlineExceeded(InvokeError):
    """The task was accepted but did not complete within the execute deadline. It may still
    complete (until its ttl): invoke again with the same ``message_id`` to hear how it ends."""


class TaskFailed(InvokeError):
    """The task failed after an agent took it: ``error`` is what the agent reported or,
    when a later attempt was refused (its breaker open, the ttl out between retries), that
    refusal (``error.type``: circuit_open, expired, …), naming the attempt that failed.
    A handler ran, so sending the task again under a new id may run it twice.

    ``ending`` is how the message ended, the error reply's ``reason``: the dead-letter
    reason (``retries_exhausted``, ``expired``, ``rejected``, ``no_route``, …), ``refused``
    (no dead letter), ``cancelled``, ``duplicate_id``; None when the coordinator did not
    say (one older than that field). ``attempts`` is how many attempts ran, for an ending
    after attempts (a task moved off a gone agent before it ran one is on a later ``attempt``
    than it ran); None when not said. ``attempt`` is the attempt the ending came at (3 for a
    task dead-lettered after its third failed); None when not known."""

    def __init__(
        self,
        error: ErrorInfo,
        *,
        message_id: str,
        trace_id: str,
        ending: str | None = None,
        attempt: int | None = None,
        attempts: int | None = None,
    ) -> None:
        # Its id and ending in the text too: a log line or a traceback was all a user had,
        # with no id to look the task up by (`reach trace`, `reach dlq show`).
        said = f"message {message_id}" + (f", {ending}" if ending else "")
        super().__init__(
            f"{error.type}: {error.message} ({said})", message_id=message_id, trace_id=trace_id
        )
        self.error = error
        self.ending = ending
        self.attempt = attempt
        self.attempts = attempts


class Rejected(TaskFailed):
    """The task was refused before any agent accepted it, so no handler ran; ``reason``
    says why (no_route, backpressure, rate_limited, circuit_open, expired,
    priority_not_allowed, …). Sending it again is safe (after ``error.retry_after_ms``,
    when given). A refusal after an attempt ran raises :class:`TaskFailed` instead.
    (``reason`` is ``error.type``, the refusal's kind; ``ending`` says whether it left a
    dead letter: ``refused`` when it did not.)"""

    @property
    def reason(self) -> str:
        return self.error.type


REJECTION_REASONS = frozenset(
    {
        "no_route",
        "expired",
        "invalid_envelope",
        "backpressure",
        "rate_limited",
        "circuit_open",
        "too_large",
        "duplicate_id",  # the message id is another caller's message
        "priority_not_allowed",  # the caller may not send tasks of that priority
        "record_too_large",  # a workflow's record: too large to start (when ran is false)
    }
)


def not_provisioned(task: Task, subject: str) -> NotProvisioned:
    """Nothing was sent: the server has no stream for ``subject``."""
    return NotProvisioned(
        f"{task.topic!r} was not sent: no stream on this server takes {subject!r}; provision"
        " it with `reach provision --nats-url URL` (or start a coordinator on it,"
        " `reach coordinator`), with the same --prefix",
        message_id=task.message_id,
        trace_id=task.trace_id,
    )


def not_stored(task: Task, exc: Exception) -> NotStored:
    """JetStream did not answer the publish: it may have been stored."""
    return NotStored(
        f"{task.topic!r} may not have been stored: JetStream did not answer ({exc}); send it"
        f" again with message_id={task.message_id!r}: the stream and the agents keep it one"
        " message",
        message_id=task.message_id,
        trace_id=task.trace_id,
    )


def backlog_full(task: Task, caller: str, exc: SubjectFull) -> BacklogFull:
    """Nothing was sent: the caller's backlog on the topic, or the whole intake, stayed full
    for the whole ttl."""
    held = (
        f"the intake was full ({exc}; limits.tasks_bytes): no coordinator took tasks from it"
        if isinstance(exc, StreamFull)
        else f"the intake held as many of {caller!r}'s tasks on it as it keeps"
        " (limits.tasks_per_subject)"
    )
    return BacklogFull(
        f"{task.topic!r} was not sent: {held} for the task's whole ttl of {task.ttl_ms} ms",
        message_id=task.message_id,
        trace_id=task.trace_id,
    )


def raise_if_lost(broker: Broker, exc: BrokerError) -> None:
    """Once the server closed this connection for good (its creds expired or were revoked),
    a ConnectError saying so instead of ``exc``: each call raised a bare "connection closed"
    (a trial's caller whose creds expired)."""
    if broker.lost.is_set():
        raise ConnectError(
            f"{broker.lost_why} ({broker.shown_url}): this connection is closed for good"
            f" ({exc}); connect again with valid creds (reach auth)"
        ) from exc
