"""A dead letter's state, and the two things that settle it: a replay and a resolution.

A letter is *open* until someone deals with it: a ``replayed`` event (:func:`replay`) makes
it *replayed*, a ``resolved`` event (:func:`resolve`) *resolved*; the later of the two
counts. A workflow step's letter that its workflow handles (``letter.workflow.handled``: the
workflow absorbed the failure, or ended with a letter of its own, the one to act on) is
*handled*, not open. :func:`letter_state` says which, for ``reach dlq list``, the dashboard
and a worker alike; :func:`settling_of` reads one letter's events. :func:`replay` refuses a
replayed or resolved letter unless forced: replaying it again runs its task again."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from agentreach import envelopes
from agentreach.agents.errors import LetterSettled, NothingToReplay, ReplayLimitReached
from agentreach.broker import Broker
from agentreach.broker.dead_letters import SETTLING, record_settling
from agentreach.broker.direct import indexed_messages_on
from agentreach.broker.errors import NoResponders
from agentreach.broker.names import COORDINATOR, OPERATOR
from agentreach.broker.streams import StoredMessage, last_message
from agentreach.envelopes import (
    DeadLetter,
    DecodeError,
    Event,
    Task,
    new_id,
    now_ms,
    replay_id,
)
from agentreach.envelopes import headers as h
from agentreach.envelopes.audit import summary_of_task

# A replay that fails the same way is dead-lettered again: a worker replaying the letters of
# that reason would replay it without end. Three replays give a slow start time to pass.
DEFAULT_MAX_REPLAYS = 3
# Dead letters a search reads at most (REACH_DLQ keeps 30 days of them, however many): at
# the first 10,000 only, silently, newer letters went unfound by `reach dlq` and the dashboard.
LETTERS_READ = 200_000
UNCHANGED: Any = object()  # replay(payload=…) not given: the task's own payload


def letter_state(settling: Sequence[Event] | None, letter: DeadLetter | None = None) -> str:
    """The state the last of a letter's ``settling`` events (its ``replayed`` and
    ``resolved`` ones, in the order stored) left; else ``handled``, for a step letter its
    workflow handles; else ``open``."""
    settling = settling_of_letter(settling, letter)
    if settling:
        return settling[-1].event
    return "handled" if letter and letter.workflow and letter.workflow.handled else "open"


def settling_of_letter(settling: Sequence[Event] | None, letter: DeadLetter | None) -> list[Event]:
    """The events of ``settling`` (a message id's) that settle ``letter``: not those of the
    letter of an earlier life of the id (sent again past the duplicate window, dead-lettered
    again). An event that does not say which letter (recorded before they did) settles any."""
    if letter is None:
        return list(settling or ())
    return [
        event
        for event in settling or ()
        if event.detail.get("letter_at_ms") in (None, letter.at_ms)
    ]


async def settling_of(broker: Broker, letter: DeadLetter) -> list[Event]:
    """The letter's last ``replayed`` and last ``resolved`` event, in the order stored (so the
    last of them is its state), from ``REACH_SETTLED``, which keeps them as long as the
    letter; from ``REACH_EVENTS`` (a week) for a letter settled before that stream was
    there. Reads by subject, which the server finds from its subject index however long the
    stream, and which a worker's permissions grant alone. ``by`` is its sender's token but
    for an operator's and the coordinator's, which name a person or say why: a worker named
    another as ``by``, whose own replay then believed it had been made, and was not."""
    names = broker.names
    kept = await _last_settling(
        broker, names.settled_stream, names.settled_of_message_of_kind, letter
    )
    found = kept or await _last_settling(
        broker, names.events_stream, names.events_of_message_of_kind, letter
    )
    events = []
    for message, event in sorted(found, key=lambda pair: pair[0].stream_seq):
        sender = names.sender_of(message.subject)
        if sender not in (OPERATOR, COORDINATOR) or "by" not in event.detail:
            event = msgspec.structs.replace(event, detail={**event.detail, "by": sender})
        events.append(event)
    return settling_of_letter(events, letter)


async def _last_settling(
    broker: Broker,
    stream: str,
    subject_of: Callable[[str, str, str], str],
    letter: DeadLetter,
) -> list[tuple[StoredMessage, Event]]:
    """The last readable event of each settling kind about ``letter`` in ``stream``."""
    subjects = [subject_of(kind, letter.trace_id, letter.message_id) for kind in SETTLING]
    try:
        lasts = await asyncio.gather(*(last_message(broker, stream, s) for s in subjects))
        found = []
        for subject, last in zip(subjects, lasts, strict=True):
            if last is None:
                continue
            if (event := _event_of(last)) is not None:
                found.append((last, event))
                continue
            # Something else written over it (a server's answer anyone can aim at the
            # subject): the last readable one before it, not none (it reopened the letter).
            stored = await indexed_messages_on(broker, stream, subject)
            readable = [(m, e) for m in stored if (e := _event_of(m)) is not None]
            found += readable[-1:]
        return found
    except NoResponders:  # REACH_SETTLED not provisioned yet (`reach provision`)
        return []


def _event_of(message: StoredMessage) -> Event | None:
    try:
        return envelopes.decode_stored_event(message.data, message.headers)
    except DecodeError:
        return None


def _settled_refusal(letter: DeadLetter, last: Event) -> LetterSettled:
    """The :class:`LetterSettled` for a letter whose last settling event is ``last``, in
    words naming the letter, its state, who and when."""
    at = datetime.datetime.fromtimestamp(last.at_ms / 1000, datetime.UTC)
    when = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    by = last.detail.get("by")
    how = (
        f"as {last.detail.get('replayed_as')}"
        if last.event == "replayed"
        else f"note {last.detail.get('note')!r}"
    )
    return LetterSettled(
        f"dead letter {letter.message_id} ({letter.reason}, topic {letter.topic}) not replayed:"
        f" it is {last.event} already, by {by} at {when} ({how})",
        message_id=letter.message_id,
        state=last.event,
        by=str(by) if by is not None else None,
        at_ms=last.at_ms,
    )


async def replay(
    broker: Broker,
    letter: DeadLetter,
    *,
    topic: str | None = None,
    ttl_ms: int | None = None,
    payload: Any = UNCHANGED,
    sender: str | None = None,
    max_replays: int = DEFAULT_MAX_REPLAYS,
    force: bool = False,
) -> Task:
    """Republish a dead letter's task with a new message_id in the same trace, as
    ``sender`` (a worker; the bare operators' form without one), its ``replays`` one more;
    with ``payload`` instead of its own when given (a fix of what it was sent with).
    Its replies went to a sender long gone, so the replay has none. Its ttl is ``ttl_ms``,
    else the letter's task's, at least the default 30 s. The new id is the
    letter's own (:func:`~agentreach.envelopes.replay_id`): replays of one letter that
    race, or one made again after a crash before it was recorded, are one message, run
    once; a forced replay is a message of its own. Refused (:class:`ReplayLimitReached`)
    when ``max_replays`` replays led to the task already, unless ``force``;
    :class:`LetterSettled` when it was replayed or resolved already (its task would run
    again), unless ``force``, or unless ``sender`` itself replayed it so already: then that
    replay is returned, nothing is sent (a worker's handler that raised after its replay is
    called again, and goes on to its next step)."""
    original = letter.envelope or _rebuilt(letter, topic, payload)
    if original.replays >= max_replays and not force:
        raise ReplayLimitReached(
            f"dead letter {letter.message_id} ({letter.reason}, topic {letter.topic}) not"
            f" replayed: its task has been replayed {original.replays} times already"
            f" (max_replays={max_replays})",
            message_id=letter.message_id,
            replays=original.replays,
            max_replays=max_replays,
        )
    to_topic = topic or original.topic
    if payload is not UNCHANGED:
        original = msgspec.structs.replace(original, payload=payload, payload_ref=None)
    fixed = None if payload is UNCHANGED else summary_of_task(original).sha256
    replay_of_letter = _replay_id_of(letter, to_topic, fixed)
    again = False
    if not force and (settling := await settling_of(broker, letter)):
        last = settling[-1]
        again = sender is not None and _replayed_as(last, sender, replay_of_letter)
        if not again:
            raise _settled_refusal(letter, last)
    task = msgspec.structs.replace(
        original,
        message_id=new_id() if force else replay_of_letter,
        topic=to_topic,
        attempt=1,
        to_agent=None,
        # A sender's long ttl is kept (what the task carried when it was dead-lettered).
        ttl_ms=ttl_ms or max(original.ttl_ms, envelopes.DEFAULT_TTL_MS),
        budget=envelopes.Budget(),  # the first caller's patience: nobody waits for this one
        replay_of=letter.message_id,
        replays=original.replays + 1,
        requeued=0,
        reply_to=None,
        created_at=now_ms(),
        received_ms=0,  # a new message: its reach latency starts at its own intake
    )
    if again:  # its replay, made by this very worker in a run that did not finish
        return task
    await broker.publish(
        broker.names.task(task.topic, sender), envelopes.encode(task), headers=h.task_headers(task)
    )
    by = sender or broker.auth.identity or "operator"
    done = {"replayed_as": task.message_id, "topic": task.topic, "replays": task.replays, "by": by}
    await record_settling(broker, letter, "replayed", sender=sender, **done)
    return task


def _rebuilt(letter: DeadLetter, topic: str | None, payload: Any) -> Task:
    """The task a letter with no decodable one stands for, given the payload it should have
    had (a fix of malformed JSON): on its topic (the subject's), in its trace."""
    to_topic = topic or letter.topic
    if payload is UNCHANGED or to_topic in ("", envelopes.INVALID_TOPIC):
        raise NothingToReplay(
            f"dead letter {letter.message_id} ({letter.reason}) has no decodable task to replay:"
            " give the payload it should have had (`reach dlq replay --payload`, `payload=`;"
            " and `--to-topic`, `topic=`, when its topic is not known), or fix its body (the"
            " letter's raw), send it again, and resolve it",
            message_id=letter.message_id,
            reason=letter.reason,
        )
    trace_id = letter.trace_id or letter.message_id
    return Task(v=1, message_id=letter.message_id, trace_id=trace_id, topic=to_topic)


def _replayed_as(last: Event, sender: str, message_id: str) -> bool:
    """Whether ``last`` records ``sender``'s replay of the letter as ``message_id``."""
    return (
        last.event == "replayed"
        and last.detail.get("by") == sender
        and last.detail.get("replayed_as") == message_id
    )


def _replay_id_of(letter: DeadLetter, to_topic: str, payload_sha256: str | None) -> str:
    """The letter's replay id; sent to another topic, or with another payload, another
    message of its own: one deduplicated against the plain replay would not run as sent."""
    envelope = letter.envelope
    caller = envelope.caller if envelope is not None else None
    other = to_topic if envelope is not None and to_topic != envelope.topic else None
    return replay_id(
        letter.at_ms,
        caller,
        letter.message_id,
        letter.replays,
        to_topic=other,
        payload_sha256=payload_sha256,
    )


async def resolve(
    broker: Broker, letter: DeadLetter, note: str, *, by: str, sender: str | None = None
) -> None:
    """Record a ``resolved`` event for the dead letter's message."""
    await record_settling(broker, letter, "resolved", sender=sender, note=note, by=by)
