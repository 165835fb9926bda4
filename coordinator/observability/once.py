"""What the fold remembers of messages: which ended already (a task is counted finished
once), and whom each attempt was routed to (an agent's report of another's is not counted)."""

from __future__ import annotations

from collections import OrderedDict

from agentreach.broker.lifecycle import AGENT_TASK_EVENTS, unvouched
from agentreach.broker.names import COORDINATOR, Names
from agentreach.envelopes import Event

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
    routed and not yet ended are kept; a report of one not seen (routed before this
    replica's fold began, or forgotten) is counted: the check costs no read."""

    def __init__(self, names: Names, limit: int = REMEMBERED) -> None:
        self._names = names
        self._routed: OrderedDict[str, tuple[tuple[int, str], ...]] = OrderedDict()
        self._limit = limit

    def vouch(self, subject: str, event: Event) -> bool:
        """Whether ``event``, stored on ``subject``, is counted (remembering a routing)."""
        if unvouched(self._names, subject, event) is not None:
            return False
        sender, kind = self._names.sender_of(subject), event.event
        routed = self._routed.get(event.message_id)
        if kind == "routed" and sender == COORDINATOR and event.agent_id:
            self._routed[event.message_id] = (*(routed or ()), (event.attempt, event.agent_id))
            if len(self._routed) > self._limit:
                self._routed.popitem(last=False)
            return True
        mine = routed is None or (event.attempt, sender) in routed
        if sender != COORDINATOR and kind in AGENT_TASK_EVENTS and not mine:
            return False
        if kind in ENDED:  # the message's routings are needed no more
            self._routed.pop(event.message_id, None)
        return True


ENDED = frozenset({"completed", "dead_lettered"})
