"""Records the coordinator keeps in KV and on its own subjects: circuit breakers, leases,
callers' quotas, workflow instances and their timers, and the answers of a routes reload.

They are wire formats like the envelopes: other replicas, the ``reach`` command line and
tools read them, so they evolve by the same rules (new fields with defaults).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from agentreach.envelopes.messages import ErrorInfo, Priority, Task, WorkflowStep

BreakerState = Literal["closed", "open", "half_open"]
WHOLE_AGENT = ""


class BreakerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """In ``reach_breakers`` under :func:`breaker_key`; shared by every coordinator replica."""

    v: Literal[1] = 1
    agent_id: str
    intent: str = WHOLE_AGENT
    state: BreakerState = "closed"
    since_ms: int = 0
    reason: str = ""
    open_until_ms: int = 0
    trials: list[str] = []  # message ids of trial calls not reported yet
    trial_ok: int = 0
    trial_deadline_ms: int = 0
    counted_from_ms: int = 0  # outcomes before this moment no longer count

    @property
    def key(self) -> str:
        return breaker_key(self.agent_id, self.intent)


def breaker_key(agent_id: str, intent: str) -> str:
    """``agent.intent`` for a breaker; the bare ``agent`` for its isolation."""
    return f"{agent_id}.{intent}" if intent else agent_id


class LeaseRecord(msgspec.Struct, frozen=True):
    """A duty held by one coordinator replica until ``until_ms``, in ``reach_leases``."""

    holder: str
    until_ms: int


class QuotaRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A caller's token bucket in ``reach_quotas`` (key: the caller): ``tokens`` left at
    ``at_ms``; every replica refills it from there and takes from it by compare-and-set."""

    tokens: float
    at_ms: int


StepStatus = Literal["waiting", "running", "completed", "failed", "timed_out", "cancelled"]
WorkflowStatus = Literal["running", "compensating", "completed", "failed", "cancelled"]


class StepRun(msgspec.Struct, kw_only=True):
    """A step (or a state's latest visit, or a compensation) of one instance."""

    status: StepStatus = "waiting"
    visit: int = 0
    message_id: str = ""
    intent: str = ""
    input: Any = None
    output: Any = None
    error: ErrorInfo | None = None
    started_ms: int = 0
    ended_ms: int = 0
    deadline_ms: int = 0
    priority: Priority = "P1"

    @property
    def sent(self) -> bool:
        """Whether its task went out: it has an intent, was not withdrawn in the change that
        began it (which clears its message id), and its input named something."""
        not_started = self.error is not None and self.error.type == "input_missing"
        return bool(self.intent and self.message_id) and not not_started


class SignalTaken(msgspec.Struct, frozen=True, kw_only=True):
    """A signal a state of the instance took: its stream sequence, and what its
    ``signal_taken`` event said (sent again as it was, with the same message id)."""

    seq: int
    event: str
    state: str
    visit: int
    by: str | None = None


class WorkflowRecord(msgspec.Struct, kw_only=True):
    """In ``reach_workflows`` under the instance id (the starting task's message id)."""

    v: Literal[1] = 1
    instance_id: str
    workflow: str
    trace_id: str
    task: Task  # the starting task: its payload, reply_to, priority
    status: WorkflowStatus = "running"
    started_ms: int = 0
    ended_ms: int = 0
    deadline_ms: int = 0
    # The definition the instance runs on to its end (a changed configuration serves new
    # instances only), as written in the config, and a fingerprint of it; empty in records
    # written before records kept it.
    definition_id: str = ""
    definition: dict[str, Any] | None = None
    # The definitions of the workflows its steps start as children, and theirs in turn, as
    # in force at its start (so a child removed from the config since still runs); None in
    # records written before records kept them (the configured workflows are its children).
    calls: dict[str, dict[str, Any]] | None = None
    steps: dict[str, StepRun] = {}  # those started so far
    # Chains, fan-outs and graphs: the definition's steps, so that progress reads as of all
    # of them; 0 for a state machine (the states it enters depend on the path taken).
    steps_total: int = 0
    current: str | None = None  # state machines: the state now
    path: list[str] = []  # state machines: every state entered, in order
    completed_order: list[str] = []  # the saga undoes these in reverse
    # The signals states took whose acknowledgement may not be applied yet, and the stream
    # sequence of the latest signal handled (taken or not): a server that dies before it
    # applied one delivers it again, as new, and a state waiting for the same event would
    # take it twice (see coordinator/workflows/taken.py).
    signals_taken: list[SignalTaken] = []
    last_signal_seq: int = 0
    # Visits a later visit of their step replaced that left an effect to undo: done (a
    # state entered again), or stopped while they ran (a step's first run, replaced by its
    # fallback), whose result may still come; by ``<step>@<visit>`` (:func:`visit_key`).
    replaced: dict[str, StepRun] = {}
    compensations: dict[str, StepRun] = {}
    # Compensating: steps stopped while they ran, whose outcome the undoing waits for (one
    # done after all is the latest done, so it is undone first), each until its deadline.
    awaiting: list[str] = []
    ending: Literal["", "failed", "cancelled"] = ""  # what compensation ends as
    result: Any = None
    error: ErrorInfo | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")

    def run_of(self, key: str) -> StepRun:
        """The visit ``key`` names: a step's latest, or a replaced one (``<step>@<visit>``)."""
        return self.replaced[key] if key in self.replaced else self.steps[key]

    @property
    def steps_began(self) -> bool:
        """Whether the instance sent a step's task (an agent, or a child workflow, may have
        acted on it). Its caller is told so (``ran``): an instance that
        ended before any, expired on arrival say, was refused; one past it failed."""
        return any(run.sent for run in self.steps.values())


class TimerDue(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow timer on ``reach.wf.timer.<instance>``: step ``key``'s ``visit`` is due."""

    key: str
    visit: int
    due_ms: int


class ReloadReply(msgspec.Struct, frozen=True, kw_only=True):
    """One replica's answer to ``reach.ctl.routes.reload``."""

    replica: str
    ok: bool
    rules: list[str] = []
    error: str = ""
    # Sections of the file changed since the replica started, which apply at its next start.
    restart_for: list[str] = []
    config_sha256: str = ""  # of the file as read now: replicas that differ read other files


UNDO = "undo"  # the visit part of a compensating task's message id (``undo<n>``: visit n's)
VISIT_MARK = "@"


def visit_key(key: str, visit: int) -> str:
    """How a replaced visit of step ``key`` is named (the step names no ``@``)."""
    return f"{key}{VISIT_MARK}{visit}"


def step_of(key: str) -> str:
    """The step a key names: itself, or the step of a replaced visit's key."""
    return key.partition(VISIT_MARK)[0]


def undo_message_id(instance_id: str, key: str, visit: int) -> str:
    """The message id of the compensation of ``key`` (a replaced visit's: of that visit)."""
    if VISIT_MARK in key:
        return step_message_id(instance_id, step_of(key), f"{UNDO}{visit}")
    return step_message_id(instance_id, key, UNDO)


def step_message_id(instance_id: str, key: str, visit: int | str) -> str:
    """The message id of visit ``visit`` of step ``key`` (``undo``: its compensation)."""
    candidate = f"{instance_id}-{key}-{visit}"
    if len(candidate) <= 128:
        return candidate
    return f"{_long_prefix(instance_id)}-{key}-{visit}"


def workflow_step_of(instance_id: str | None, task: Task) -> WorkflowStep | None:
    """The step of instance ``instance_id`` (the one ``task`` answers to, if any) that
    ``task`` is a visit of; None when its message id is none :func:`step_message_id` gives."""
    message_id = task.message_id
    for prefix in (instance_id, _long_prefix(instance_id)) if instance_id else ():
        if message_id.startswith(f"{prefix}-"):
            key, _, visit = message_id[len(prefix) + 1 :].rpartition("-")
            of_visit = visit.removeprefix(UNDO)
            if key and (visit == UNDO or visit.isdigit() or of_visit.isdigit()):
                undo = visit.startswith(UNDO)
                if undo and of_visit:  # a replaced visit's compensation
                    key = visit_key(key, int(of_visit))
                return WorkflowStep(
                    instance_id=instance_id, step=key, compensation=undo, handled=not undo
                )
    return None


def _long_prefix(instance_id: str) -> str:
    return "wf" + hashlib.sha256(instance_id.encode()).hexdigest()[:32]


def step_abandoned(
    record: WorkflowRecord | None, step: WorkflowStep, message_id: str
) -> str | None:
    """Why ``message_id``, a visit of ``step``, is one its instance (``record``, None when
    not kept) no longer waits for: cancelled, ended, or the step stopped; None while it
    does. The router refuses such a task, and a manual-review item of it is withdrawn."""
    instance_id = step.instance_id
    if record is None:
        return f"its workflow {instance_id!r} is not kept any more"
    run = (record.compensations if step.compensation else record.steps).get(step.step)
    if run is None or run.message_id != message_id:
        return f"workflow {instance_id!r} ({record.status}) no longer waits for this visit"
    if run.status == "running":
        return None
    how = record.status
    if record.status == "compensating":  # ending so: undoing what it did first
        how = f"{record.ending or 'failed'}, compensating"
    return f"step {step.step!r} of workflow {instance_id!r} is {run.status} ({how})"
