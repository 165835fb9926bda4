"""Whose run of a message an event belongs to.

A message id is its sender's: past the duplicate window another caller may send a message
under an id already used, and each run's events are its own caller's to read.
"""

from __future__ import annotations

from agentreach.broker.names import COORDINATOR, Names
from agentreach.broker.streams import StoredMessage
from agentreach.envelopes import Event


def runs_of(
    caller: str, trace: list[tuple[StoredMessage, Event]], names: Names
) -> tuple[list[Event], bool]:
    """The events of ``caller``'s own runs in ``trace`` (authentic, oldest first), and
    whether it holds others' too.

    Only the coordinator's events say whose a run is (their ``caller``, from the intake
    subject). An agent's event belongs to the caller its attempt was routed to it for; the
    body's ``caller`` only picks among several such routings, and with none (the routing no
    longer kept), the run the last coordinator's event before it opened. Given to the
    latest run, an agent's report on another caller's run under the same id (its own task,
    routed to itself) was read as alice's result, and her agent's as the other's."""
    own: list[Event] = []
    others = False
    for (_, event), whose in zip(trace, owners(trace, names), strict=True):
        if whose == caller:
            own.append(event)
        else:
            others = True
    return own, others


NOBODY = ""  # whose an event is when nothing says: no caller's name (a name is a token)


def owners(trace: list[tuple[StoredMessage, Event]], names: Names) -> list[str | None]:
    """Whose run each event of ``trace`` (authentic, oldest first) is, as :func:`runs_of`
    tells it: None for a run of no caller's (a workflow's step, an operator's bare task:
    read as the latest caller's, their results went to whoever sent a task under the id),
    :data:`NOBODY` where nothing says (an agent given the attempt for several runs, its
    event naming no caller)."""
    owner: dict[str, str | None] = {}  # message id → the caller of its latest run
    given: dict[tuple[str, int, str], set[str | None]] = {}  # (id, attempt, agent) → callers
    found: list[str | None] = []
    for message, event in trace:
        sender = names.sender_of(message.subject)
        if sender == COORDINATOR:
            owner[event.message_id] = event.caller
            if event.event == "routed" and event.agent_id:
                attempt = (event.message_id, event.attempt, event.agent_id)
                given.setdefault(attempt, set()).add(event.caller)
            found.append(event.caller)
            continue
        callers = given.get((event.message_id, event.attempt, sender))
        if not callers:  # its routing no longer kept: the run the latest one opened
            found.append(owner.get(event.message_id))
        elif event.caller is not None and event.caller in callers:
            found.append(event.caller)
        elif len(callers) == 1:
            found.append(next(iter(callers)))
        else:  # naming none (an agent of revision 34), it is not the caller-less run's either
            found.append(NOBODY)
    return found
