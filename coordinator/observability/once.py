"""What the fold remembers of messages: which ended already (a task is counted finished
once), and whom each attempt was routed to (an agent's report of another's is not counted)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgspec

from agentreach.broker import Broker, BrokerError, Delivery
from agentreach.broker.direct import indexed_messages_on
from agentreach.broker.lifecycle import AGENT_TASK_EVENTS, unvouched
from agentreach.broker.names import COORDINATOR, Names
from agentreach.broker.streams import StoredMessage
from agentreach.envelopes import DecodeError, Event, Priority, decode_stored_event

REMEMBERED = 65_536  # ends remembered; the oldest is forgotten first


class Ends:
    """The last ``limit`` messages seen ending, by trace and message id (an agent's event
    need not name the caller). A second ending
    (a result sent again after the stream's two-minute dedup window, a completion after a
    dead letter) is not a second finished task. Per replica and since its start: an ending
    told again to another replica, or after a restart, is counted again."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._limit = limit

    def first(self, trace_id: str, message_id: str) -> bool:
        """Whether this is the first ending seen of the message (and remember it)."""
        key = (trace_id, message_id)
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return True


class Routes:
    """What the fold counts of each event: what its subject vouches for (no agent's body of a
    coordinator's kind, or naming another agent), and of an agent's report of an attempt,
    only one routed to it (a forged `completed` faked the success ratio and the latency, and
    the real ending was then not counted). The routings of the last ``limit`` messages seen
    routed and not yet ended are kept. Those of a report's message not seen here (routed
    before the fold began, forgotten, or folded by another replica sharing the consumer) are
    read first (:meth:`look_up`): counted without them, a report of a message never routed
    (an outside trial's ghosts) faked the counts as before. A report read before its
    ``routed`` was stored (an election of the events stream between the two) is not counted;
    one whose routings could not be read is. A report counted carries its routing's
    ``received_ms`` and ``priority``, the coordinator's, not what the agent wrote (a latency
    it made up, a priority label of its choosing)."""

    def __init__(self, names: Names, limit: int = REMEMBERED) -> None:
        self._names = names
        self._routed: OrderedDict[str, tuple[Routing, ...]] = OrderedDict()
        self._limit = limit

    async def look_up(self, broker: Broker, deliveries: Sequence[Delivery]) -> None:
        """Read the routings of the reports among ``deliveries`` (a batch, in order) whose
        message's routing this fold has not seen, at most LOOKUPS_AT_ONCE at a time."""
        wanted = self._unseen(d.subject for d in deliveries)
        if not wanted:
            return
        room = asyncio.Semaphore(LOOKUPS_AT_ONCE)

        async def routings(subject: str) -> tuple[Routing, ...] | None:
            async with room:
                try:
                    stored = await indexed_messages_on(broker, self._names.events_stream, subject)
                except BrokerError:
                    return None  # counted, as before this check
            return tuple(_routings(self._names, stored))

        found = await asyncio.gather(*(routings(subject) for subject in wanted.values()))
        for message_id, routed in zip(wanted, found, strict=True):
            if routed is not None:
                self._remember(message_id, routed)

    def _unseen(self, subjects: Iterable[str]) -> dict[str, str]:
        """Of the events on ``subjects``, in order, the agents' reports of messages whose
        routing is not known here: message id → the subject of its ``routed`` events."""
        names, routed_here, wanted = self._names, set[str](), dict[str, str]()
        for subject in subjects:
            if (ids := _ids_of(subject)) is None:
                continue
            trace_id, message_id = ids
            kind, sender = names.kind_of_event_subject(subject), names.sender_of(subject)
            if kind == "routed" and sender == COORDINATOR:
                routed_here.add(message_id)
            elif (
                kind in AGENT_TASK_EVENTS
                and sender != COORDINATOR
                and message_id not in self._routed
                and message_id not in routed_here
            ):
                wanted[message_id] = names.events_of_message_of_kind("routed", trace_id, message_id)
        return wanted

    def _remember(self, message_id: str, routed: tuple[Routing, ...]) -> None:
        self._routed[message_id] = routed
        if len(self._routed) > self._limit:
            self._routed.popitem(last=False)

    def vouch(self, subject: str, event: Event) -> bool:
        """Whether ``event``, stored on ``subject``, is counted (see :meth:`vouched`)."""
        return self.vouched(subject, event) is not None

    def vouched(self, subject: str, event: Event) -> Event | None:
        """``event``, stored on ``subject``, as it is counted; None when it is not
        (remembering a routing)."""
        if unvouched(self._names, subject, event) is not None:
            return None
        sender, kind = self._names.sender_of(subject), event.event
        routed = self._routed.get(event.message_id)
        if kind == "routed" and sender == COORDINATOR and event.agent_id:
            routing = Routing.of(event)
            if routing not in (routed or ()):  # not a looked-up one
                self._remember(event.message_id, (*(routed or ()), routing))
            return event
        if sender != COORDINATOR and kind in AGENT_TASK_EVENTS:
            if _ids_of(subject) != (event.trace_id, event.message_id):
                return None  # its routing was looked up by the subject's ids
            if routed is not None:
                given = [r for r in routed if (r.attempt, r.agent_id) == (event.attempt, sender)]
                if not given:
                    return None
                event = given[-1].stamped(event)  # the last: a later life's, when two
        if kind in ENDED:  # the message's routings are needed no more
            self._routed.pop(event.message_id, None)
        return event


class Routing(NamedTuple):
    """An attempt given to an agent, as the coordinator's ``routed`` event says."""

    attempt: int
    agent_id: str
    received_ms: int
    priority: Priority

    @classmethod
    def of(cls, routed: Event) -> Routing:
        assert routed.agent_id is not None
        return cls(routed.attempt, routed.agent_id, routed.received_ms, routed.priority)

    def stamped(self, report: Event) -> Event:
        """``report`` with the routing's intake time and priority."""
        if (report.received_ms, report.priority) == (self.received_ms, self.priority):
            return report
        return msgspec.structs.replace(report, received_ms=self.received_ms, priority=self.priority)


ENDED = frozenset({"completed", "dead_lettered"})
LOOKUPS_AT_ONCE = 32  # reads of routings in flight for one batch


def _ids_of(subject: str) -> tuple[str, str] | None:
    """The trace and message ids an event's subject names (None: too few tokens)."""
    parts = subject.rsplit(".", 3)
    return (parts[1], parts[2]) if len(parts) == 4 else None


def _routings(names: Names, stored: Iterable[StoredMessage]) -> Iterable[Routing]:
    """The routing of each of the coordinator's ``routed`` events among ``stored``."""
    for message in stored:
        if names.sender_of(message.subject) != COORDINATOR:
            continue
        try:
            event = decode_stored_event(message.data, message.headers)
        except DecodeError:
            continue
        if event.event == "routed" and event.agent_id:
            yield Routing.of(event)


class Redeliveries:
    """The events this fold counted already and is handed again. The consumer acknowledges
    nothing, and a nats-server killed -9 forgets how far it had delivered: it hands out its
    last moments again (an outside operator trial counted 101 dispatches of 100 routed). A
    pull consumer hands out events in stream order, so one at or below the last sequence
    this replica counted, and stored no later, was handed out before: to this replica, which
    counted it, or to another, which did. One stored later is of a stream made again (a
    server back on an empty store), whose sequences start over. What another replica
    counted and this one is handed again past its own last may still be counted twice."""

    def __init__(self) -> None:
        self._seq = self._stored_ms = 0

    def again(self, seq: int, stored_ms: int) -> bool:
        """Whether the event at ``seq``, stored at ``stored_ms``, was handed out before."""
        if seq <= self._seq and stored_ms <= self._stored_ms:
            return True
        self._seq, self._stored_ms = seq, stored_ms
        return False
