"""A dispatched message that JetStream gave up on (max deliveries) becomes a dead letter.

The advisory is captured in a stream, so it waits for a coordinator that is down.
Dispatch streams are work queues: the message stays until removed, so it is
read, dead-lettered, and only then deleted — never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, Delivery
from agentreach.broker.dead_letters import dead_letter
from agentreach.broker.streams import StoredMessage, delete_message, get_message
from agentreach.coordinator.delivery.advisory_checks import unfounded
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.protection.grants import Grants
from agentreach.coordinator.routing.run_once import (
    RanAlready,
    Running,
    RunOnce,
    answer_from_record,
)
from agentreach.envelopes import (
    INVALID_TOPIC,
    DecodeError,
    ErrorInfo,
    Task,
    decode_as,
    is_token,
    stable_id,
)
from agentreach.envelopes.server_answers import copied_by_direct_get, server_answer
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.advisories")

# Advisories not acted on are said at most this many times a minute per kind: an agent can
# have copies of its JSON stored on the advisories' subjects as fast as the server stores.
NOT_ACTED_ON_SAID_PER_MINUTE = 10
LEASE_MARGIN_S = 0.5  # past a lease's end, for its holder's last renewal to be seen
LOOK_AGAIN_CAP_S = 60.0  # a long lease is looked at again this often (its run may end)


class MaxDeliveries(msgspec.Struct, frozen=True):
    """The parts of ``io.nats.jetstream.advisory.v1.max_deliver`` we use."""

    stream: str
    consumer: str
    stream_seq: int
    deliveries: int


class Advisories:
    """Turns max-deliveries advisories of the agents' consumers into ``retries_exhausted``
    dead letters: a dispatched task no agent acknowledged. (The coordinator's own consumers
    end a message at its last delivery themselves: :meth:`Consumption.settle`.)"""

    def __init__(self, broker: Broker, grants: Grants | None = None) -> None:
        self._broker = broker
        self._run_once = RunOnce(broker, grants)
        self._sealed = grants is not None and grants.enabled
        self._not_acted_on = RepeatedLines(60.0, burst=NOT_ACTED_ON_SAID_PER_MINUTE)

    async def handle(self, msg: Delivery) -> float | None:
        """None once the advisory is acted on (or not to be), else the seconds until it
        is looked at again: its task's run still holds a lease."""
        if copied_by_direct_get(msg.headers):  # an agent's content, aimed here: it killed
            self._say("warning", "advisory copied by a direct get: nobody's", subject=msg.subject)
            return None  # a running task of another caller's (a security re-test)
        try:
            advisory = decode_as(msg.data, MaxDeliveries)
        except DecodeError as exc:
            self._say("error", "unreadable advisory", subject=msg.subject, error=str(exc))
            return None
        if advisory.stream not in self._broker.names.dispatch_streams.values():
            # The coordinator's own consumers end a message at its last delivery themselves
            # (see Consumption.settle); a copy of an agent's JSON said so of a waiting task.
            line = "an advisory about no agent's queue: not acted on"
            self._say("info", line, subject=msg.subject)
            return None
        stored = await get_message(self._broker, advisory.stream, advisory.stream_seq)
        if stored is None:
            return None  # acknowledged or removed since: nothing was lost
        if why := await unfounded(self._broker, msg.subject, advisory, stored):
            line = "max-deliveries advisory not acted on"
            self._say("warning", line, subject=msg.subject, why=why)
            return None
        agent_id = self._broker.names.agent_of_dispatch_subject(stored.subject)
        error = _never_acknowledged(advisory, agent_id)
        if (later_s := await self._dead_letter(stored, error, agent_id)) is not None:
            return later_s
        await delete_message(self._broker, advisory.stream, advisory.stream_seq)
        return None

    def _say(self, level: str, line: str, **values: object) -> None:
        if (unsaid := self._not_acted_on.due(line)) is not None:
            more = {"more_not_said": unsaid} if unsaid else {}
            getattr(log, level)(line, **values, **more)

    async def _dead_letter(
        self, stored: StoredMessage, error: ErrorInfo, agent_id: str | None
    ) -> float | None:
        """None once ``stored`` is ended (its task answered, or it dead-lettered), else the
        seconds until the lease its run holds runs out."""
        task = _task_in(stored.data, stored.headers)
        if task is not None and agent_id is not None:
            try:  # a task someone had copied onto the queue is answered from no record
                self._run_once.vouch(task, agent_id, stored.headers)
            except DecodeError:
                task = None
        if task is not None:
            ran = await self._run_once.verdict(task)
            if isinstance(ran, Running):
                # Its run may go on, or its agent died under a lease that has yet to run out
                # (`max_deliver=1`, at most once): looked at again when it has. Let go, the
                # task stayed in the agent's queue until its ttl, to expire "gone silent".
                log.info("max deliveries said of a task under a lease", left_s=ran.left_s)
                return min(ran.left_s + LEASE_MARGIN_S, LOOK_AGAIN_CAP_S)
            # Every acknowledgement of a run lost (servers failing over): the work is done.
            if isinstance(ran, RanAlready):
                await answer_from_record(self._broker, task, ran.record)
                return None
            log.warning("max deliveries reached", message_id=task.message_id, error=error.message)
            await end_with_error(self._broker, task, "retries_exhausted", error)
            return None
        # Its id is its sender's word: nobody's on a sealed deployment (a copy of an agent's
        # own message, or a hand-made dispatch) nor in a server's answer. Taken, it named a
        # letter, and a dead_lettered event in that message's trace, after alice's message.
        believed = not self._sealed and not server_answer(stored.data, stored.headers)
        claimed = stored.headers.get("Nats-Msg-Id") if believed else None
        message_id = claimed if is_token(claimed) else None
        message_id = message_id or stable_id(stored.timestamp_ns, stored.subject, stored.stream_seq)
        await dead_letter(
            self._broker,
            reason="retries_exhausted",
            message_id=message_id,
            trace_id=message_id,
            topic=INVALID_TOPIC,
            error=error,
            raw=stored.data,
            headers={**stored.headers, "Reach-Subject": stored.subject},
        )
        return None


def _never_acknowledged(advisory: MaxDeliveries, agent_id: str | None) -> ErrorInfo:
    """The error of a message delivered ``max_deliver`` times: to an agent (``agent_id``,
    a dispatch), said as what it most likely means, its process dying or stalling on it."""
    times = advisory.deliveries
    message = (
        f"delivered {times} times to agent {agent_id} and never acknowledged: each of its"
        f" processes that took it died or stalled before finishing, or stopped (a stop hands"
        f" back what it holds, for a delivery each) (consumer {advisory.consumer})"
        if agent_id
        else f"delivered {times} times to {advisory.consumer} without an acknowledgement"
    )
    return ErrorInfo(type="max_deliveries", message=message, retryable=False)


def _task_in(data: bytes, headers: Mapping[str, str]) -> Task | None:
    """The task a stored message is (a dispatch) or is about (an outcome event), if any;
    none in a server's answer (no headers, or a direct get's)."""
    if not headers or server_answer(data, headers):
        return None
    try:
        return envelopes.decode_task(data)
    except DecodeError:
        pass
    try:
        event = envelopes.decode_stored_event(data, headers)
        return msgspec.convert(event.detail.get("task"), Task)
    except (DecodeError, msgspec.ValidationError):
        return None
