"""A message ends once: with its result, or in the dead-letter stream.

The fences in the agents' records keep an honest agent from completing a message the
coordinator ended (and the coordinator from ending one that ran), but an agent that ignores
them (or a run that outlived a lease nobody fenced) can complete a message after its dead
letter. Its work was done then, and the letter is a trap: a worker replaying it runs the work
again. So an ending stored after another is not a second record: a result sent again (a
redelivery of a task that ran) is left alone, and a completion and a dead letter of one
message raise an ``ended_twice`` alert and resolve the letter, saying why. (Not a dead
letter of a later life of the id: another request sent under it past the duplicate window,
refused; the work done was not its.)
"""

from __future__ import annotations

import structlog

from agentreach.broker import Broker
from agentreach.broker.dead_letters import record_settling
from agentreach.broker.lifecycle import agent_event, emit
from agentreach.broker.names import COORDINATOR
from agentreach.broker.streams import StoredMessage
from agentreach.envelopes import DeadLetter, Event

log = structlog.get_logger("coordinator.endings")

ENDINGS = ("completed", "dead_lettered", "workflow_completed")


def earlier_ending(run: list[tuple[StoredMessage, Event]], stream_seq: int) -> Event | None:
    """The ending of ``run`` (one caller's authentic events, :meth:`MessageEvents.run_at`)
    stored before the event at ``stream_seq``, if any: another caller's run under the id
    ended its own message (an agent's task under alice's id resolved her dead letter, and
    took her audit record)."""
    for message, event in run:
        if message.stream_seq < stream_seq and event.event in ENDINGS:
            return event
    return None


async def ended_again(broker: Broker, ending: Event, first: Event) -> None:
    """``ending`` came after ``first``: an alert and the letter resolved when one of them is
    a completion and the other a dead letter; else (the same end told again) nothing."""
    if {ending.event, first.event} != {"completed", "dead_lettered"}:
        log.info("an ending told again; no second record", kind=ending.event,
                 message_id=ending.message_id)  # fmt: skip
        return
    done, dead = (ending, first) if ending.event == "completed" else (first, ending)
    if 0 < done.received_ms < dead.received_ms:  # the id sent again, past the duplicate window
        log.info("a later life of the message id ended otherwise", message_id=dead.message_id,
                 reason=dead.detail.get("reason"))  # fmt: skip
        return  # another request under the id, refused: the work done was not its
    reason = str(dead.detail.get("reason", "unknown"))
    when = "after" if ending is done else "before"
    why = (
        f"completed by {done.agent_id} {when} it was dead-lettered ({reason}): its work was"
        " done, so its letter is resolved and no worker replays it"
    )
    log.warning("a message ended twice", message_id=done.message_id, why=why)
    letter = DeadLetter(
        v=1,
        reason=reason,
        message_id=dead.message_id,
        trace_id=dead.trace_id,
        topic=dead.topic,
        attempts=dead.attempt,
        at_ms=dead.at_ms,  # the letter's own: the resolution settles that letter, no other
    )
    await record_settling(broker, letter, "resolved", sender=COORDINATOR, note=why, by=COORDINATOR)
    alert = agent_event(
        done.agent_id or COORDINATOR,
        "alert",
        problem="ended_twice",
        why=why,
        kind=ending.event,
        message_id=done.message_id,
    )
    await emit(broker, alert)
