"""Whether a max-deliveries advisory is founded: the server's word about a message one of the
consumers the coordinator answers for really gave up on.

The server's own advisories carry no headers, and neither does what it sends of a stored
message when a direct get asks for none (`no_hdr`), to any subject its requester names: an
agent had such a copy of its own JSON stored as an advisory naming a stream and a sequence of
its choice, and the coordinator ended another caller's running task, answered one from its
record to the agent's box, or copied bucket values into dead letters (a security re-test).
What it says is checked against the server's own state before anything is done.
"""

from __future__ import annotations

from typing import Protocol

from agentreach.broker import Broker, consumer_state
from agentreach.broker.direct import subject_matches
from agentreach.broker.streams import StoredMessage


class Advisory(Protocol):
    stream: str
    consumer: str
    stream_seq: int
    deliveries: int


async def unfounded(
    broker: Broker, subject: str, advisory: Advisory, stored: StoredMessage
) -> str | None:
    """Why ``advisory`` (stored on ``subject``, about ``stored``) is not to be acted on, or
    None: its subject names another stream or consumer; the consumer is not the one of the
    agent whose queue holds the message; the consumer does
    not exist, does not take the message's subject, has no such delivery limit, or has not
    delivered the message or has it acknowledged."""
    *_, stream, consumer = subject.split(".")
    if (stream, consumer) != (advisory.stream, advisory.consumer):
        return (
            f"its subject names {stream}/{consumer}, its body {advisory.stream}/{advisory.consumer}"
        )
    expected = _consumer_of(broker, advisory.stream, stored.subject)
    if consumer != expected:
        return f"{stream}/{consumer} is not the one of the agent whose queue holds the message"
    state = await consumer_state(broker, stream, consumer)  # raises BrokerError: retried
    if state is None:
        return f"no consumer {stream}/{consumer}"
    spec, seq = state.spec, advisory.stream_seq
    if spec.filter_subjects and not any(
        subject_matches(f, stored.subject) for f in spec.filter_subjects
    ):
        return f"{consumer} does not take {stored.subject}"
    if spec.max_deliver > 0 and spec.max_deliver != advisory.deliveries:
        return f"{consumer} delivers {spec.max_deliver} times, not {advisory.deliveries}"
    if not state.ack_floor_seq < seq <= state.delivered_seq:
        return f"{consumer} has not delivered message {seq} or has it acknowledged"
    return None


def _consumer_of(broker: Broker, stream: str, stored_subject: str) -> str | None:
    """The consumer of dispatch ``stream`` whose advisories the coordinator acts on: the
    agent's whose queue holds the message."""
    names = broker.names
    for priority, dispatch in names.dispatch_streams.items():
        if stream == dispatch:
            return names.agent_consumer(names.agent_of_dispatch_subject(stored_subject), priority)
    return None
