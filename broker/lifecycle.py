"""Publishing and reading what happens to a message: lifecycle events and replies (dead
letters: :mod:`agentreach.broker.dead_letters`).

Events are deduplicated by ``Nats-Msg-Id``, so a process that crashes after publishing
and does its work again does not record it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentreach import envelopes
from agentreach.broker.connection import Broker
from agentreach.broker.direct import indexed_messages_on
from agentreach.broker.errors import translated
from agentreach.broker.names import COORDINATOR, Names
from agentreach.broker.pipelined import Outgoing
from agentreach.broker.runs import owners, runs_of
from agentreach.broker.streams import StoredMessage
from agentreach.envelopes import (
    ErrorReply,
    Event,
    Result,
    Task,
    now_ms,
)
from agentreach.logs import FirstTimes, get_logger

log = get_logger("broker.lifecycle")


def about(task: Task, **fields: Any) -> dict[str, Any]:
    """The fields every reply and event about ``task`` repeats (its ids, topic and attempt),
    stamped now; ``fields`` add to or override them."""
    return {
        "v": 1,
        "message_id": task.message_id,
        "trace_id": task.trace_id,
        "topic": task.topic,
        "attempt": task.attempt,
        "created_at": now_ms(),
        **fields,
    }


def event_for(about_: Task, event: str, /, *, agent_id: str | None = None, **detail: Any) -> Event:
    """An event about a task, carrying its ids, topic and attempt; ``detail`` is free-form."""
    fields = about(about_, event=event, agent_id=agent_id, caller=about_.caller, detail=detail)
    fields["at_ms"] = fields.pop("created_at")
    return Event(**fields, priority=about_.priority, received_ms=about_.received_ms)


# The coordinator's proof, on a dispatch, that the attempt was given to that agent.
GRANT_HEADER = "Reach-Grant"
SEAL_HEADER = "Reach-Seal"  # copied into the agent's execution record of the attempt
AGENT_TOPIC = "_agent"  # the topic of events about an agent rather than a task
# Events that may come many times for one attempt, each one counting.
REPEATABLE = frozenset({"progress", "signal_ignored"})
SHOWN_IDS = 3  # message ids named in an "events left out" line
_SAID_LEFT_OUT = FirstTimes(4096)  # stored events said left out already
# What an agent says about a task it was given.
AGENT_TASK_EVENTS = frozenset(
    {"accepted", "progress", "completed", "failed", "expired", "late_result_rejected"}
)
# What an agent says about itself (topic `_agent`, trace = its id), not about a task.
AGENT_OWN_EVENTS = frozenset({"clock_drift"})
# Every kind a party other than the coordinator sends (an agent's, a worker's).
PARTY_EVENTS = frozenset(envelopes.AGENT_EVENTS) | frozenset(envelopes.WORKER_EVENTS)


def agent_event(agent_id: str, event: str, **detail: Any) -> Event:
    """An event about an agent (not a task): topic ``_agent``, trace = the agent id."""
    return Event(
        v=1,
        event=event,
        message_id=envelopes.new_id(),
        trace_id=agent_id,
        topic=AGENT_TOPIC,
        agent_id=agent_id,
        at_ms=now_ms(),
        detail=detail,
    )


async def emit(
    broker: Broker, event: Event, *, sender: str = COORDINATOR, since_break: int | None = None
) -> None:
    """Publish ``event`` as ``sender`` (an agent or worker id; the coordinator by default) to
    ``reach.event.<event>.<topic>.<trace_id>.<message_id>.<sender>``; ``since_break``: as
    :meth:`Broker.publish` takes it."""
    subject, data, headers = event_message(broker, event, sender=sender)
    await broker.publish(subject, data, headers=headers, since_break=since_break)


def event_message(broker: Broker, event: Event, *, sender: str = COORDINATOR) -> Outgoing:
    """What :func:`emit` publishes, as a message for :meth:`Broker.publish_all`."""
    subject = broker.names.event(event.event, event.topic, event.trace_id, event.message_id, sender)
    # Never none: a stored event without headers is taken for a server's answer (no_hdr).
    headers = {"Reach-Kind": "event"}
    ignored_seq = event.detail.get("signal_seq") if event.event == "signal_ignored" else None
    if event.event not in REPEATABLE or ignored_seq is not None:
        # Dedup is stream-wide: with the sender in the id, nobody can pre-empt another's.
        msg_id = f"{event.message_id}-{event.event}-{event.attempt}-{sender}"
        if sender == COORDINATOR and event.caller:
            # Past the duplicate window another caller may send a message under the same
            # id: its run's events are its own, not duplicates of the first caller's.
            msg_id = f"{event.caller}.{msg_id}"
        if event.event == "routed":  # an agent that refuses leads to routing again
            msg_id += f"-{event.agent_id}"
        if event.event == "replayed":  # each forced replay of one letter is a replay of its own
            msg_id += f"-{event.detail.get('replayed_as')}"
        if event.event == "signal_taken":  # each visit of a state leaves it once
            msg_id += f"-{event.detail.get('state')}-{event.detail.get('visit')}"
        if ignored_seq is not None:  # each signal ignored is said once, handled again or not
            msg_id += f"-{ignored_seq}"
        if event.event == "cancel_refused":  # each cancel refused is said once
            msg_id += f"-{event.detail.get('cancel_seq')}"
        epoch = event.detail.get("epoch")
        if event.event == "accepted" and isinstance(epoch, int) and epoch > 0:
            msg_id += f"-{epoch}"  # each process that takes the attempt is seen to
        if event.received_ms > 0:
            # One life of the message id: sent again past the intake's duplicate window, its
            # attempts' events are not duplicates of the earlier life's still in this one's.
            msg_id += f"-r{event.received_ms}"
        grant = event.detail.get("grant")
        if sender != COORDINATOR and isinstance(grant, str):
            # Only the coordinator and this agent know the grant: nobody can pre-empt the id.
            msg_id += f"-{grant[:16]}"
        headers["Nats-Msg-Id"] = msg_id
    return Outgoing(subject, envelopes.encode(event), headers)


async def reply(
    broker: Broker,
    task: Task,
    message: envelopes.Reply,
    *,
    sender: str = COORDINATOR,
    since_break: int | None = None,
) -> None:
    """Send an ack, progress, result, error or routed notice to the task's ``reply_to``, if
    it has one, as ``sender`` (see :meth:`Names.reply_subject`). A workflow's reply subject
    is sent only a result or an error, which ``REACH_WORKFLOWS`` stores: a JetStream publish,
    made again through a leader election (a core publish was lost in one, and the instance
    waited for its deadline with the step's work done). Without a ``Nats-Msg-Id``: the
    stream's dedup is stream-wide, and another agent of the workflow could store a
    predictable one first, dropping this result; a copy stored twice changes nothing.
    ``since_break``: as :meth:`Broker.publish` takes it (a core one waits for the connection
    then, and is refused unsent as a write is)."""
    if not task.reply_to:
        return
    final = isinstance(message, Result | ErrorReply)
    to_workflow = broker.names.workflow_replies(task.reply_to)
    if not final and to_workflow:
        return  # a workflow reads only a step's result or error, and every reply is stored
    kind = str(type(message).__struct_config__.tag)
    headers = {"Reach-Trace-Id": task.trace_id, "Reach-Kind": kind}
    subject = broker.names.reply_subject(task.reply_to, sender)
    if to_workflow:
        await broker.publish(
            subject, envelopes.encode(message), headers=headers, since_break=since_break
        )
        return
    if since_break is not None:  # not left in nats-py's buffer to go out after the break
        with translated(subject=subject):
            await broker.link.unbroken(since_break, subject, broker.request_timeout)
    await broker.publish_core(subject, envelopes.encode(message), headers=headers)


async def trace_of(broker: Broker, message_id: str) -> list[Event]:
    """Every authentic recorded event of ``message_id``, oldest first (see :func:`authentic`)."""
    return await _authentic_on(broker, broker.names.events_of_message(message_id))


async def events_of_id(broker: Broker, wanted: str) -> list[Event]:
    """The events of the message ``wanted``, or else of the trace ``wanted``, oldest first."""
    if found := await trace_of(broker, wanted):
        return found
    # An agent's own events carry its id as their trace: not a message of a trace.
    traced = await _authentic_on(broker, broker.names.events_of_trace(wanted))
    return [event for event in traced if event.topic != AGENT_TOPIC]


async def own_events(broker: Broker, caller: str, subject: str) -> tuple[list[Event], bool]:
    """The authentic events on ``subject`` (a message's, a trace's) of the runs ``caller``
    sent (see :func:`~agentreach.broker.runs.runs_of`), and whether there are others' too."""
    # Not a scan of every event: see broker.direct.
    stored = await indexed_messages_on(broker, broker.names.events_stream, subject)
    return runs_of(caller, authentic(broker.names, stored), broker.names)


async def _authentic_on(broker: Broker, subject: str) -> list[Event]:
    # Through the subject index: a wildcard read by message id looks at every event stored.
    stored = await indexed_messages_on(broker, broker.names.events_stream, subject)
    return [event for _, event in authentic(broker.names, stored)]


# An event is judged unrouted only after this many looks, a second apart: the `routed` event
# and the dispatch are written to two streams, and in a cluster the dispatch (and the agent's
# answer) may be stored before `routed` is, while the events stream elects a leader.
UNROUTED_LOOKS = 3
UNROUTED_LOOK_AGAIN_S = 1.0


@dataclass(frozen=True, slots=True)
class MessageEvents:
    """What is stored of one message's events, and which of them are authentic."""

    stored: list[StoredMessage]
    authentic: list[tuple[StoredMessage, Event]]

    def run_at(self, names: Names, stream_seq: int) -> list[tuple[StoredMessage, Event]]:
        """The authentic events of the run the event at ``stream_seq`` is of: one caller's
        (another may send a message under the same id, :func:`~agentreach.broker.runs.
        runs_of`); all of them when that event is not among them."""
        pairs = list(zip(self.authentic, owners(self.authentic, names), strict=True))
        at = [whose for (message, _), whose in pairs if message.stream_seq == stream_seq]
        if not at:
            return self.authentic
        return [pair for pair, whose in pairs if whose == at[0]]

    def run_of(self, names: Names, caller: str | None) -> list[tuple[StoredMessage, Event]]:
        """The authentic events of ``caller``'s runs of the id (None: of runs of no caller's,
        and those nothing says whose they are)."""
        whose = owners(self.authentic, names)
        return [pair for pair, w in zip(self.authentic, whose, strict=True) if w == caller]

    def vouch_for(self, stream_seq: int) -> bool:
        """Whether the event stored at ``stream_seq`` is authentic (one the stream holds no
        more cannot be checked against the routing, only by its sender token)."""
        if all(m.stream_seq != stream_seq for m in self.stored):
            return True
        return any(m.stream_seq == stream_seq for m, _ in self.authentic)


async def events_of(broker: Broker, trace_id: str, message_id: str) -> MessageEvents:
    """The stored events of one message, read through the subject index (by trace too: a
    read by message id alone looks at every event in the stream)."""
    names = broker.names
    subject = names.events_of_message_in_trace(trace_id, message_id)
    stored = await indexed_messages_on(broker, names.events_stream, subject)
    return MessageEvents(stored, authentic(names, stored))


# Why an agent's event is left out that may only be early (see authentic).
NOT_ROUTED_YET = (
    "no routed event gives their attempt to their sender (not stored yet, after a server"
    " restart or an election; dispatched past the coordinator; or forged)"
)


def authentic(names: Names, stored: list[StoredMessage]) -> list[tuple[StoredMessage, Event]]:
    """The events that are what they claim, oldest first: the coordinator's own, and an
    agent's about a task only when it was that agent the coordinator routed the attempt to
    (the sender token of each subject is unforgeable under permissions). Unreadable ones and
    the rest are left out, and said so in the log."""
    decoded: list[tuple[StoredMessage, Event, str]] = []
    left_out: dict[str, list[tuple[StoredMessage, Event]]] = {}
    for message in stored:
        try:
            event = envelopes.decode_stored_event(message.data, message.headers)
        except envelopes.DecodeError:
            continue
        if (why := unvouched(names, message.subject, event)) is not None:
            left_out.setdefault(why, []).append((message, event))
            continue
        decoded.append((message, event, names.sender_of(message.subject)))
    routed: dict[tuple[str, int], set[tuple[str, str | None]]] = {}
    for _, event, sender in decoded:
        if event.event == "routed" and sender == COORDINATOR and event.agent_id:
            given = (event.agent_id, event.caller)
            routed.setdefault((event.message_id, event.attempt), set()).add(given)
    kept: list[tuple[StoredMessage, Event]] = []
    for message, event, sender in decoded:
        if (why := _not_routed_to(event, sender, routed)) is None:
            kept.append((message, event))
        else:
            left_out.setdefault(why, []).append((message, event))
    _say_left_out(left_out)
    return kept


def _say_left_out(left_out: dict[str, list[tuple[StoredMessage, Event]]]) -> None:
    """Each event left out said once per process, with its message ids: every read of the
    message's events (each later event, each trace asked for) found it again, and one forged
    event made seven warnings (a secured trial)."""
    for why, events in left_out.items():
        fresh = [event for message, event in events if _SAID_LEFT_OUT.first(_stored_id(message))]
        if not fresh:
            continue
        # Not routed yet is what a restart or an election leaves for a moment (a cluster
        # trial: 7 warnings in a rolling restart): those who act on the event look again, and
        # raise an impersonation alert when it never is.
        said = log.debug if why == NOT_ROUTED_YET else log.warning
        ids = sorted({event.message_id for event in fresh})
        said("events left out", why=why, count=len(fresh), message_ids=ids[:SHOWN_IDS])


def _stored_id(message: StoredMessage) -> tuple[int, int]:
    return message.stream_seq, message.timestamp_ns  # one stored message, whichever server


def unvouched(names: Names, subject: str, event: Event) -> str | None:
    """Why the subject ``event`` was stored on does not vouch for its body; None when it
    does. Permissions vouch for a subject (its kind, and its last token: the sender), not for
    the body: the coordinator's is taken as it is; another party's only when its body is of
    the subject's kind and names no other agent, and an agent's event about itself only when
    it is about itself."""
    sender = names.sender_of(subject)
    if sender == COORDINATOR:
        return None
    if event.event not in PARTY_EVENTS:
        return "their body is of a kind only the coordinator sends"
    if event.event != names.kind_of_event_subject(subject):
        return "their body is of another kind than their subject"
    if event.agent_id not in (None, sender):
        return "their body names another agent than their sender"
    if event.event in AGENT_OWN_EVENTS and (event.trace_id, event.topic) != (sender, AGENT_TOPIC):
        return "an agent's event about itself that is about something else"
    return None


def _not_routed_to(
    event: Event, sender: str, routed: dict[tuple[str, int], set[tuple[str, str | None]]]
) -> str | None:
    """Why ``event``, vouched for by its subject, is not what it claims; None when it is: an
    agent's event about a task must be about an attempt given to it, and of the caller it
    was given for (one caller's message id may be another's: an agent routed its own task
    under alice's id said alice's task failed)."""
    if sender == COORDINATOR or event.event not in AGENT_TASK_EVENTS:
        return None
    given = routed.get((event.message_id, event.attempt), set())
    if not any(agent == sender for agent, _ in given):
        return NOT_ROUTED_YET
    if event.caller is not None and (sender, event.caller) not in given:
        return "their attempt was given to their sender for another caller"
    return None


def routed_callers(events: MessageEvents, agent_id: str, attempt: int) -> set[str | None]:
    """The callers whose message (of these events' id) had ``attempt`` routed to
    ``agent_id``."""
    return {
        event.caller
        for _, event in events.authentic
        if event.event == "routed" and event.agent_id == agent_id and event.attempt == attempt
    }
