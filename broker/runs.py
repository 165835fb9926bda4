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
    subject); an agent's event belongs to the run the last of those before it opened."""
    owner: dict[str, str] = {}  # message id → the caller of its latest run
    own: list[Event] = []
    others = False
    for message, event in trace:
        if names.sender_of(message.subject) == COORDINATOR and event.caller is not None:
            owner[event.message_id] = event.caller
        if owner.get(event.message_id) == caller:
            own.append(event)
        else:
            others = True
    return own, others
