"""Test helpers that await what happens on the broker instead of sleeping."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import CollectorRegistry

from agentreach import envelopes
from agentreach.agents import Agent, TaskContext
from agentreach.broker import Broker, Delivery
from agentreach.broker.dead_letters import dead_letter
from agentreach.broker.record_seal import RECORD_HEADERS
from agentreach.broker.watch import BucketWatch
from agentreach.envelopes import AgentCard, DeadLetter, Event, Execution, Task, execution_key

# What a message of a party carries at least (a dispatch, a retry): one with no headers at
# all is taken for a direct get's answer asking for none (no_hdr), and is nobody's.
DISPATCHED = {"Reach-Kind": "task"}


def echoing(agent_id: str, *topics: str) -> Agent:
    """An agent whose handler of each of ``topics`` returns its payload."""
    agent = Agent(agent_id, startup_delay=0)

    async def echo(ctx: TaskContext, payload: Any) -> Any:
        return payload

    for topic in topics:
        agent.handler(topic)(echo)
    return agent


def held(agent_id: str, topic: str) -> tuple[Agent, asyncio.Event, list[str]]:
    """An agent whose handler of ``topic`` notes each message id it runs, then returns its
    payload once the event is set: ``(agent, the event, the ids run)``."""
    agent, gate, runs = Agent(agent_id, startup_delay=0), asyncio.Event(), list[str]()

    @agent.handler(topic)
    async def hold(ctx: TaskContext, payload: Any) -> Any:
        runs.append(ctx.message_id)
        await gate.wait()
        return payload

    return agent, gate, runs


async def put_value(broker: Broker, bucket: str, key: str, data: bytes) -> int:
    """Write ``data`` at ``key`` as every party writes a record, with its header: a secured
    reader takes a value with none for a direct get's bare copy. Returns the revision."""
    ack = await broker.publish(f"$KV.{bucket}.{key}", data, headers=dict(RECORD_HEADERS))
    return ack.seq


class Watcher:
    """Records every event and dead letter published while it is open.

    It sees a message when the server routes it, which can be before the stream has stored
    it: a test that then reads the stream waits until the stream holds it (``until_true``)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.events: list[Event] = []
        self.dead_letters: list[DeadLetter] = []
        self._changed = asyncio.Condition()
        self._subs: list[Subscription] = []

    async def __aenter__(self) -> Self:
        names = self._broker.names
        self._subs = [
            await self._broker.nc.subscribe(names.events_wildcard, cb=self._on_event),
            await self._broker.nc.subscribe(names.dlq_wildcard, cb=self._on_dead_letter),
        ]
        await self._broker.nc.flush()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sub in self._subs:
            await sub.unsubscribe()

    async def _on_event(self, msg: Msg) -> None:
        self.events.append(envelopes.decode_event(msg.data))
        async with self._changed:
            self._changed.notify_all()

    async def _on_dead_letter(self, msg: Msg) -> None:
        self.dead_letters.append(envelopes.decode_dead_letter(msg.data))
        async with self._changed:
            self._changed.notify_all()

    async def event(
        self,
        kind: str,
        *,
        topic: str | None = None,
        message_id: str | None = None,
        timeout: float = 10.0,
    ) -> Event:
        """The first event of ``kind`` (and topic / message id, if given)."""

        def found() -> Event | None:
            for event in self.events:
                if (
                    event.event == kind
                    and topic in (None, event.topic)
                    and (message_id in (None, event.message_id))
                ):
                    return event
            return None

        return await self._until(found, f"event {kind} topic={topic} id={message_id}", timeout)

    async def state(
        self,
        agent_id: str,
        state: str,
        *,
        reason: str | None = None,
        after: Event | None = None,
        timeout: float = 10.0,
    ) -> Event:
        """The first liveness transition of ``agent_id`` to ``state`` (and reason),
        after the transition ``after`` when given."""

        def found() -> Event | None:
            states = self.states(agent_id)
            if after is not None:
                states = states[states.index(after) + 1 :]
            for event in states:
                if event.detail["state"] == state and reason in (None, event.detail["reason"]):
                    return event
            return None

        return await self._until(found, f"{agent_id} {state} {reason or ''}", timeout)

    def states(self, agent_id: str) -> list[Event]:
        """Every liveness transition of ``agent_id`` seen so far."""
        return [e for e in self.events if e.event == "agent_state" and e.agent_id == agent_id]

    async def dead_letter(
        self,
        reason: str,
        *,
        topic: str | None = None,
        message_id: str | None = None,
        timeout: float = 10.0,
    ) -> DeadLetter:
        """The first dead letter with ``reason`` (and topic / message id, if given)."""

        def found() -> DeadLetter | None:
            for letter in self.dead_letters:
                if (
                    letter.reason == reason
                    and topic in (None, letter.topic)
                    and message_id in (None, letter.message_id)
                ):
                    return letter
            return None

        return await self._until(found, f"dead letter {reason} topic={topic}", timeout)

    async def until(self, found, what: str, timeout: float = 20.0):  # type: ignore[no-untyped-def]
        """Until ``found()`` returns something other than None (re-checked on each arrival)."""
        return await self._until(found, what, timeout)

    def ids_with(self, kind: str, ids: set[str]) -> set[str]:
        """Which of ``ids`` had an event of ``kind`` so far (an event told twice, such as a
        result sent again, counts once: waiting for all of them, use this, not count)."""
        return {e.message_id for e in self.events if e.event == kind and e.message_id in ids}

    def count(self, kind: str, ids: set[str] | None = None) -> int:
        """How many events of ``kind`` (about one of ``ids``, if given) arrived so far."""
        return sum(
            1 for e in self.events if e.event == kind and (ids is None or e.message_id in ids)
        )

    async def _until(self, found, what: str, timeout: float):  # type: ignore[no-untyped-def]
        try:
            async with asyncio.timeout(timeout):
                async with self._changed:
                    while (hit := found()) is None:
                        await self._changed.wait()
                    return hit
        except TimeoutError:
            seen = [(e.event, e.topic) for e in self.events]
            raise AssertionError(f"no {what} within {timeout}s; saw events {seen}") from None


async def wait_for_card(
    broker: Broker, agent_id: str, *, status: str, epoch: int = 0, timeout: float = 20.0
) -> None:
    """Until the agent's card in the registry has ``status`` (and at least ``epoch``)."""
    kv = await broker.kv(broker.names.agents_bucket)
    async with asyncio.timeout(timeout), BucketWatch(kv) as watch:
        async for change in watch:
            if change.key != agent_id or change.value is None:
                continue
            card = msgspec.json.decode(change.value, type=AgentCard)
            if card.status == status and card.epoch >= epoch:
                return


async def eventually(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Until ``condition()`` holds, for in-memory views that have no event of their own."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def until_true(check, timeout: float = 20.0, every_s: float = 0.1):  # type: ignore[no-untyped-def]
    """Until ``await check()`` is truthy (for broker state that has no event of its own);
    returns what it returned."""
    async with asyncio.timeout(timeout):
        while not (found := await check()):  # noqa: ASYNC110
            await asyncio.sleep(every_s)
        return found


async def recorded(
    broker: Broker, message_id: str, agent_id: str, state: str, **fields: Any
) -> int:
    """``agent_id``'s execution record of ``message_id`` (sent without a caller), written as
    its run would write it; returns its revision."""
    records = await broker.bucket(broker.names.executions_bucket, Execution)
    record = Execution(message_id=message_id, state=state, agent_id=agent_id, **fields)  # type: ignore[arg-type]
    return await records.create(execution_key(None, message_id, agent_id), record)


async def letter_of(
    broker: Broker, task: Task, reason: str = "no_route", **fields: Any
) -> DeadLetter:
    """Dead-letter ``task`` as ``reason`` under its own ids and topic (what a test sets up)."""
    return await dead_letter(
        broker,
        reason=reason,
        task=task,
        message_id=task.message_id,
        trace_id=task.trace_id,
        topic=task.topic,
        **fields,
    )


async def stopped(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped. ``kill`` returns when
    the signal is queued: until one thread takes it, the others run on (on a busy machine
    long enough for a server to acknowledge a publish sent after the ``kill``)."""
    os.kill(pid, signal.SIGSTOP)
    async with asyncio.timeout(timeout):
        while not _all_threads_stopped(pid):  # noqa: ASYNC110 - a stop has no event to await
            await asyncio.sleep(0.005)


def _all_threads_stopped(pid: int) -> bool:
    return all(_thread_stopped(stat) for stat in Path(f"/proc/{pid}/task").glob("*/stat"))


def _thread_stopped(stat: Path) -> bool:
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True  # the thread has exited
    return state in ("T", "t")


async def events_settled(broker: Broker, consumer: str) -> None:
    """Until ``consumer`` on the events stream has handled and acknowledged everything."""
    async with asyncio.timeout(10):
        while True:
            info = await broker.js.consumer_info(broker.names.events_stream, consumer)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.05)  # polling the consumer's state: there is no event for it


def delivered_again_as_new(delivery: Delivery, count: int = 1) -> Delivery:
    """``delivery`` as a server that died before it applied the acknowledgement delivers it
    again: the same message and stream sequence, delivery count 1 (or ``count``: one whose
    count the server kept; it answers the acknowledgement of a message gone all the same)."""
    msg = delivery._msg
    tokens = (msg.reply or "").split(".")
    tokens[4] = str(count)  # $JS.ACK.<stream>.<consumer>.<delivered>.…
    reply = ".".join(tokens)
    return Delivery(Msg(msg._client, msg.subject, reply, msg.data, msg.headers))


def scraped(registry: CollectorRegistry) -> Callable[..., float | None]:
    """The registry's values once a scrape has shown its new series at 0 (what was counted on
    them shows at the next: see ``coordinator.observability.priming.Children``)."""
    list(registry.collect())
    return registry.get_sample_value
