"""Tasks stored in the intake (``REACH_TASKS``) that the coordinator has not routed yet, found
by a message id or a trace id. No event of such a task is recorded (no agent can take it now,
or no coordinator runs), so without them its trace reads as an id nobody sent."""

from __future__ import annotations

from agentreach.broker import Broker, StoredMessage, consumer_state
from agentreach.broker.direct import messages_on
from agentreach.broker.streams import stream_bounds
from agentreach.envelopes import DecodeError, Task, Unrouted, stable_id, task_from_intake

# The newest intake messages read at most: a trace is one lookup, not a scan of a backlog
# that may hold millions.
LOOKED_AT = 10_000


async def unrouted(broker: Broker, some_id: str, *, caller: str | None = None) -> list[Unrouted]:
    """The intake's tasks whose message id or trace id is ``some_id``, among those the
    coordinator's intake consumer has not had acknowledged (a routed task is, at once),
    oldest first; with ``caller``, only the tasks it sent as itself."""
    names = broker.names
    intake = await consumer_state(broker, names.tasks_stream, names.coordinator_intake)
    _, last = await stream_bounds(broker, names.tasks_stream)
    floor = intake.ack_floor_seq if intake is not None else 0
    delivered = intake.delivered_seq if intake is not None else 0
    subject = names.task("*", caller) if caller else names.tasks_wildcard
    start = max(floor + 1, last - LOOKED_AT + 1)
    stored = await messages_on(broker, names.tasks_stream, subject, from_seq=start, limit=LOOKED_AT)
    found = []
    for message in stored:
        task = _task_in(broker, message)
        if task is not None and some_id in (task.message_id, task.trace_id):
            held = message.stream_seq <= delivered
            found.append(_described(task, message.timestamp_ms, held=held))
    return found


def _task_in(broker: Broker, message: StoredMessage) -> Task | None:
    """The task ``message`` holds, with the ids intake gives it (a bare body's from its
    headers, or derived as intake derives them); None when intake will refuse it."""
    stream = broker.names.tasks_stream
    topic, _ = broker.names.task_subject_parts(message.subject)
    try:
        return task_from_intake(
            message.data,
            message.headers,
            topic=topic,
            received_ms=message.timestamp_ms,
            fallback_id=stable_id(message.timestamp_ns, stream, message.stream_seq),
        )
    except DecodeError:
        return None


def _described(task: Task, stored_ms: int, *, held: bool) -> Unrouted:
    return Unrouted(
        message_id=task.message_id,
        trace_id=task.trace_id,
        topic=task.topic,
        priority=task.priority,
        stored_ms=stored_ms,
        held=held,
    )


def why_unrouted(task: Unrouted, *, coordinator_runs: bool = True) -> str:
    """Why ``task`` is not routed yet, in words."""
    if not coordinator_runs:
        return "no coordinator runs: start `reach up` or `reach coordinator`"
    if task.held:
        return "waiting for an agent that can take it"
    return "the coordinator has not taken it in yet: tasks stored before it go first"
