"""``reach trace ID``: every lifecycle event of a message or a trace (and the tree of the
workflows it started), for a person to read; of a task no event is recorded of yet, that it
waits in the intake and why."""

from __future__ import annotations

import argparse
import datetime as dt
from collections import Counter
from dataclasses import dataclass

from agentreach import envelopes
from agentreach.broker import (
    Broker,
    BrokerTimeout,
    NoResponders,
    StoredMessage,
    read_stream,
)
from agentreach.broker.lifecycle import AGENT_TOPIC, authentic
from agentreach.broker.names import COORDINATOR, OPERATOR
from agentreach.cli import workflow_views
from agentreach.cli.exit_codes import OK
from agentreach.cli.options import ASKING_ROLES, Commands, UsageError, an_id, broker_of
from agentreach.cli.status import NOT_RUNNING, coordinators
from agentreach.cli.terminal import one_line
from agentreach.coordinator.delivery.unrouted import LOOKED_AT, unrouted, why_unrouted
from agentreach.coordinator.workflows import read_record
from agentreach.dashboard.trace import received_ms
from agentreach.envelopes import Event, TraceReply, TraceRequest, Unrouted
from agentreach.envelopes.described import described
from agentreach.envelopes.events import WORKER_EVENTS

TRACE_WAIT_S = 5.0


def register(commands: Commands) -> None:
    trace = commands.add(
        "trace",
        cmd_trace,
        "every lifecycle event of a message_id or trace_id",
        example=("reach trace first", "reach trace 4bf92f3577b34da6a3ce929d0e0e4736"),
    )
    trace.add_argument(
        "id", type=an_id, help="a message_id, a trace_id (or a W3C trace id), a workflow id"
    )


async def cmd_trace(args: argparse.Namespace) -> int:
    async with broker_of(args) as broker:
        if broker.auth.role in ASKING_ROLES:
            return await _trace_of_own(broker, args.id)
        steps = await collect(broker, args.id)
        instances = {args.id} | {
            s.event.message_id for s in steps if s.event.event == "workflow_started"
        }
        records = [r for i in sorted(instances) if (r := await read_record(broker, i))]
        if not steps and not records:
            return await _waiting_in_intake(broker, args.id)
    for record in records:
        print(workflow_views.tree(record))
    print(render(args.id, steps))
    return OK


async def _waiting_in_intake(broker: Broker, some_id: str) -> int:
    """No event of ``some_id`` is recorded: the tasks of that id that wait in the intake, not
    routed yet, or that it is unknown."""
    waiting = await unrouted(broker, some_id)
    if not waiting:
        raise UsageError(
            f"no events recorded for {some_id!r}, nor a task of that id among the newest"
            f" {LOOKED_AT:,} in the intake (is it a message_id or trace_id?)"
        )
    print(render_unrouted(waiting, coordinator_runs=bool(await coordinators(broker))))
    return OK


async def _trace_of_own(broker: Broker, message_id: str) -> int:
    """A party's own message, through the coordinator (``reach.ctl.trace.<name>``)."""
    request = envelopes.encode(TraceRequest(message_id=message_id))
    subject = broker.names.trace_request(broker.auth.identity or "")
    try:
        answer = await broker.request(subject, request, timeout=TRACE_WAIT_S)
    except (NoResponders, BrokerTimeout):
        raise UsageError(
            f"{NOT_RUNNING}: a {broker.auth.role} reads traces through it (what it sent waits"
            " in the intake meanwhile, within its ttl)"
        ) from None
    reply = envelopes.decode_as(answer.data, TraceReply)
    if not reply.events and reply.unrouted:
        print(render_unrouted(reply.unrouted))
        return OK
    if not reply.events:
        who = broker.auth.identity
        raise UsageError(
            f"no events of {message_id!r} among {who}'s own messages (a {broker.auth.role}"
            " sees only the messages it sent, by message id or trace id; an operator's creds"
            " read every trace)"
        )
    steps = [
        Step(at=dt.datetime.fromtimestamp(e.at_ms / 1000, dt.UTC), seq=n, event=e)
        for n, e in enumerate(reply.events)
    ]
    print(render(message_id, steps))
    if reply.truncated:
        print("(the oldest events did not fit one reply and are left out)")
    return OK


ENDINGS = frozenset({"completed", "dead_lettered"})
RUN_EVENTS = frozenset({"accepted", "progress", "completed", "failed", "expired"})
# A run's event after the message ended (a stopped agent's run, reassigned and completed by
# another, or expired, failing at its deadline once resumed): it read as the task failing.
LATE = "  (late: a run's report after the message ended)"


@dataclass(frozen=True, slots=True)
class Step:
    """An event with the broker's time of recording it, and who published it (the sender
    token of its subject; the coordinator's, when a reply carried the events alone)."""

    at: dt.datetime
    seq: int
    event: Event
    sender: str = COORDINATOR


async def collect(broker: Broker, some_id: str) -> list[Step]:
    """Events whose message_id or trace_id is ``some_id``, in the order the broker stored them;
    events not from whom they claim are left out (see ``lifecycle.authentic``)."""
    names = broker.names
    stored: dict[int, StoredMessage] = {}
    for subject in (names.events_of_message(some_id), names.events_of_trace(some_id)):
        for message in await read_stream(broker, names.events_stream, subject):
            stored[message.stream_seq] = message
    ordered = [stored[seq] for seq in sorted(stored)]
    return [
        Step(
            at=dt.datetime.fromtimestamp(message.timestamp_ns / 1e9, dt.UTC),
            seq=message.stream_seq,
            event=event,
            sender=names.sender_of(message.subject),
        )
        for message, event in authentic(names, ordered)
        # An agent's own events carry its id as their trace: not a message of a trace.
        if event.topic != AGENT_TOPIC or event.message_id == some_id
    ]


def render(some_id: str, steps: list[Step]) -> str:
    """A block per message, a line per event: time, offset, event, agent, details."""
    if not steps:
        return f"no events recorded for {some_id!r} (is it a message_id or trace_id?)"
    messages, shared = _by_message(steps)
    received = {m: _received(own) for m, own in messages.items()}
    start = min([steps[0].at, *(at for at in received.values() if at is not None)])
    trace_ids = sorted({s.event.trace_id for s in steps})
    lines = [f"trace {', '.join(trace_ids)} · {len(messages)} message(s)"]
    for (message_id, caller), own in messages.items():
        by = f"  caller {caller or '(none: the bare subject)'}" if message_id in shared else ""
        lines.append(f"message {message_id}  topic {own[0].event.topic}{by}")
        if (at := received[message_id, caller]) is not None:
            clock = at.astimezone().strftime("%H:%M:%S.%f")[:-3]
            lines.append(f"  {clock} {offset_shown((at - start).total_seconds()):>10}  received")
        ended_at: int | None = None  # the attempt that ended the message, once it did
        for step in own:
            late = ended_at is not None and _late(step.event, ended_at)
            lines.append(_line(step, start) + (LATE if late else ""))
            if step.event.event in ENDINGS:
                ended_at = step.event.attempt
    return "\n".join(lines)


def _by_message(steps: list[Step]) -> tuple[dict[tuple[str, str | None], list[Step]], set[str]]:
    """Each message's steps, by (message id, caller: None for the operators' bare form), and
    the ids two callers used: each caller's message is its own (shown as one, they read as
    one message run twice: an outside trial)."""
    messages: dict[tuple[str, str | None], list[Step]] = {}
    for step in steps:
        messages.setdefault((step.event.message_id, step.event.caller), []).append(step)
    runs = Counter(message_id for message_id, _ in messages)
    return messages, {message_id for message_id, count in runs.items() if count > 1}


def _received(own: list[Step]) -> dt.datetime | None:
    """When the intake stored the message, when before its first event (it waited there)."""
    first_ms = own[0].at.timestamp() * 1000
    at_ms = received_ms((step.event for step in own), first_ms)
    return None if at_ms is None else dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC)


def render_unrouted(waiting: list[Unrouted], *, coordinator_runs: bool = True) -> str:
    """A line per task stored in the intake and not routed yet: when, what, and why."""
    return "\n".join(_unrouted_line(task, coordinator_runs) for task in waiting)


def _unrouted_line(task: Unrouted, coordinator_runs: bool) -> str:
    stored = dt.datetime.fromtimestamp(task.stored_ms / 1000, dt.UTC).astimezone()
    why = why_unrouted(task, coordinator_runs=coordinator_runs)
    return (
        f"{task.message_id}: stored in the intake at {stored:%Y-%m-%d %H:%M:%S %Z}, not routed"
        f" yet (topic {task.topic}, priority {task.priority}; {why})"
    )


def _late(event: Event, ended_at: int) -> bool:
    """Whether an agent's event about a run comes after the message ended: an earlier
    attempt's, or the ending attempt's own (a stopped agent's run, resumed after the message
    expired, reporting `failed`: a re-trial)."""
    return event.event in RUN_EVENTS and event.attempt <= ended_at


def _line(step: Step, start: dt.datetime) -> str:
    event = step.event
    clock = step.at.astimezone().strftime("%H:%M:%S.%f")[:-3]
    # A dead letter's settling names its sender token as agent_id: said as who it was.
    settling = event.event in WORKER_EVENTS
    agent = _publisher(step) if settling else event.agent_id or _person(event) or _publisher(step)
    attempt = f"#{event.attempt}"
    since = offset_shown((step.at - start).total_seconds())
    line = f"  {clock} {since:>10}  {event.event:<18} {attempt:<3} {agent:<20} "
    return one_line(line + described(event)).rstrip()


def offset_shown(seconds: float) -> str:
    """An event's time since the first, in at most 10 characters: ``+12.3ms`` up to 10 s,
    then ``+613.207s``, then ``+26h02m05s`` (a retry backoff, a manual review)."""
    if seconds < 10:
        return f"+{seconds * 1000:.1f}ms"
    if seconds < 3600:
        return f"+{seconds:.3f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"+{hours}h{minutes:02d}m{secs:02d}s"


def _person(event: Event) -> str:
    """Who acted, when a person did (a manual-review answer, take or send)."""
    who = event.detail.get("answered_by") or event.detail.get("by")
    return f"person:{who}" if who and event.event.startswith(("completed", "manual_")) else ""


def _publisher(step: Step) -> str:
    """Who published an event about no agent: an operator (``operator:<by>``, from ``reach
    dlq`` or the dashboard), a worker (its name), else the coordinator."""
    if step.sender == OPERATOR:
        by = step.event.detail.get("by")
        return f"operator:{by}" if by and by != "operator" else "operator"
    return "coordinator" if step.sender == COORDINATOR else step.sender
