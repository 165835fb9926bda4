"""The kit's side of the wire: sending tasks as a client (through intake) or as the
coordinator would (straight to the agent's dispatch subject), and seeing everything that
comes back — replies, events with their headers, dead letters, heartbeats, cards."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError, Bucket, ClaimCheck, Inbound, Subscription
from agentreach.broker.lifecycle import GRANT_HEADER
from agentreach.conformance.exchange import Exchange, Seen
from agentreach.conformance.process import AgentProcess
from agentreach.conformance.report import Failed
from agentreach.envelopes import (
    AgentCard,
    Budget,
    DeadLetter,
    DecodeError,
    Event,
    Execution,
    Heartbeat,
    PayloadRef,
    Priority,
    Task,
    execution_key,
    new_id,
    now_ms,
)
from agentreach.envelopes import headers as h

T = TypeVar("T")
QUIET_S = 0.3  # how long "nothing more came" is watched for
CALLER = "reach-conformance"  # the kit's sender token when it calls as a client


class Session:
    """One conformance run's connection, the agent's id and topic, and what it has seen."""

    def __init__(
        self, broker: Broker, agent_id: str, topic: str, process: AgentProcess | None
    ) -> None:
        self.broker = broker
        self.names = broker.names
        self.agent_id = agent_id
        self.topic = topic
        self.process = process
        self.exchanges: dict[str, Exchange] = {}
        self.dead_letters: list[DeadLetter] = []
        self.no_tasks: list[Event] = []  # the agent's reports of dispatches that are no task
        self.beats: list[Seen] = []
        self.cards: list[Seen] = []
        self.expect_exit = False  # the kit stopped the agent's process on purpose
        self._changed = asyncio.Condition()
        self._subs: list[Subscription] = []
        self._loop = asyncio.get_running_loop()
        self.claim_check = ClaimCheck(broker)

    async def open(self) -> None:
        names = self.names
        self._subs += [
            await self.broker.subscribe(names.dlq_wildcard, self._on_dead_letter),
            await self.broker.subscribe(
                names.event("failed", envelopes.INVALID_TOPIC, "*", "*", self.agent_id),
                self._on_no_task,
            ),
            await self.broker.subscribe(
                f"$KV.{names.heartbeats_bucket}.{self.agent_id}", self._on_beat
            ),
            await self.broker.subscribe(
                f"$KV.{names.agents_bucket}.{self.agent_id}", self._on_card
            ),
        ]
        await self.broker.flush()

    async def close(self) -> None:
        for sub in self._subs:
            await sub.close()

    def now(self) -> float:
        return self._loop.time()

    # -- sending ------------------------------------------------------------------------
    def task(
        self,
        payload: Any,
        *,
        topic: str | None = None,
        ttl_ms: int = 30_000,
        budget: Budget | None = None,
        attempt: int = 1,
        reply: bool = True,
        to_agent: str | None = None,
        priority: Priority = "P1",
    ) -> Task:
        """A task for the agent, in a trace of its own, whose replies come to a reply box of
        the kit's (``reach.reply.reach-conformance.<box>``: where an agent may answer even on
        a server with permissions). Its ``received_ms`` is set, as intake would set it, so
        that the kit can see the agent's events echo it (submitted, intake sets its own)."""
        message_id = new_id()
        box = self.names.reply_box(CALLER, message_id.replace("-", ""))
        return Task(
            v=1,
            message_id=message_id,
            trace_id=message_id,
            topic=topic or self.topic,
            payload=payload,
            ttl_ms=ttl_ms,
            budget=budget or Budget(),
            attempt=attempt,
            reply_to=box if reply else None,
            to_agent=to_agent,
            priority=priority,
            from_agent=CALLER,
            created_at=now_ms(),
            received_ms=now_ms(),
        )

    async def submit(self, task: Task, *, as_caller: bool = False) -> Exchange:
        """Send ``task`` to intake, as a client does: the coordinator routes it. As a caller
        (``reach.task.<topic>.<caller>``), the task's ``caller`` is the kit's token."""
        exchange = await self._watch(task)
        subject = self.names.task(task.topic, CALLER if as_caller else None)
        await self.broker.publish(subject, envelopes.encode(task), headers=h.task_headers(task))
        return exchange

    async def dispatch(self, task: Task, *, msg_id: str | None = None) -> Exchange:
        """Put ``task`` straight into the agent's queue, as the coordinator would (again, when
        it is sent twice: a duplicate delivery)."""
        exchange = self.exchanges.get(task.message_id) or await self._watch(task)
        routed = msgspec.structs.replace(task, to_agent=self.agent_id)
        headers = h.task_headers(routed, msg_id=msg_id or f"{task.message_id}-{new_id()}")
        # A grant of the kit's own: the agent must echo whatever the dispatch carries. (A
        # coordinator with a seal key ignores the outcome events of these tasks: they are the
        # kit's, and it reads them itself.)
        exchange.grant = exchange.grant or f"kit{new_id().replace('-', '')[:29]}"
        headers[GRANT_HEADER] = exchange.grant
        subject = self.names.dispatch(self.agent_id, task.priority)
        stored = await self.broker.publish(subject, envelopes.encode(routed), headers=headers)
        exchange.seqs.append(stored.seq)
        return exchange

    async def dispatch_by_server(self, task: Task) -> Exchange:
        """Have the NATS server put ``task`` into the agent's queue, as anyone can: stored
        under a key of the kit's, then direct-got with the reply aimed at the queue."""
        exchange = await self._watch(task)
        own = f"$KV.{self.names.executions_bucket}.kit.{task.message_id}.kit"
        await self.broker.publish(own, envelopes.encode(task), headers=h.task_headers(task))
        direct = f"$JS.API.DIRECT.GET.KV_{self.names.executions_bucket}.{own}"
        await self.broker.publish_core(direct, b"", reply=self.names.dispatch(self.agent_id, "P1"))
        return exchange

    async def dispatch_raw(self, body: bytes, *, priority: Priority = "P1") -> None:
        """Put bytes that are not a valid task into the agent's queue."""
        subject = self.names.dispatch(self.agent_id, priority)
        await self.broker.publish(subject, body, headers={h.MSG_ID: f"raw-{new_id()}"})

    async def _watch(self, task: Task) -> Exchange:
        exchange = self.exchanges[task.message_id] = Exchange(task, sent_at=self.now())

        async def on_reply(msg: Inbound) -> None:
            with contextlib.suppress(DecodeError):
                await self._add(exchange.replies, envelopes.decode_reply(msg.data), msg)

        async def on_event(msg: Inbound) -> None:
            with contextlib.suppress(DecodeError):
                await self._add(
                    exchange.events, envelopes.decode_stored_event(msg.data, msg.headers), msg
                )

        if task.reply_to:
            # A reply box gets each reply on <box>.<sender>; any other subject as it is.
            boxed = task.reply_to.startswith(f"{self.names.prefix}.reply.")
            subject = f"{task.reply_to}.>" if boxed else task.reply_to
            self._subs.append(await self.broker.subscribe(subject, on_reply))
        subject = self.names.events_of_message(task.message_id)
        self._subs.append(await self.broker.subscribe(subject, on_event))
        await self.broker.flush()  # subscribed before anything can answer
        return exchange

    async def stow(self, name: str, value: Any) -> PayloadRef:
        """``value`` put in the payloads Object Store as a sender's claim check does."""
        return await self.claim_check.put(name, envelopes.encode(value))

    async def fetch(self, ref: PayloadRef) -> Any:
        """What a claim check names, checked by its SHA-256 (a Failed when it cannot be)."""
        try:
            return envelopes.decode_json(await self.claim_check.get(ref))
        except (BrokerError, DecodeError) as exc:
            raise Failed(f"the agent's claim check {ref.bucket}/{ref.name}: {exc}") from None

    # -- seeing ---------------------------------------------------------------------------
    async def _add(self, into: list[Seen], body: Any, msg: Inbound) -> None:
        into.append(Seen(body, dict(msg.headers), self.now(), msg.subject))
        async with self._changed:
            self._changed.notify_all()

    async def _on_dead_letter(self, msg: Inbound) -> None:
        with contextlib.suppress(DecodeError):
            letter = envelopes.decode_dead_letter(msg.data, msg.headers, stored=True)
            self.dead_letters.append(letter)
            async with self._changed:
                self._changed.notify_all()

    async def _on_no_task(self, msg: Inbound) -> None:
        with contextlib.suppress(DecodeError):
            self.no_tasks.append(envelopes.decode_stored_event(msg.data, msg.headers))
            async with self._changed:
                self._changed.notify_all()

    async def _on_beat(self, msg: Inbound) -> None:
        gone = msg.headers.get("KV-Operation") in ("DEL", "PURGE")
        try:
            body = None if gone else envelopes.decode_as(msg.data, Heartbeat)
        except DecodeError as exc:
            body = exc  # judged by the heartbeat clause
        await self._add(self.beats, body, msg)

    async def _on_card(self, msg: Inbound) -> None:
        gone = msg.headers.get("KV-Operation") in ("DEL", "PURGE")
        try:
            body = None if gone else envelopes.decode_as(msg.data, AgentCard)
        except DecodeError as exc:
            body = exc
        await self._add(self.cards, body, msg)

    async def until(
        self,
        found: Callable[[], T | None],
        timeout_s: float,
        what: str,
        *,
        instead: Callable[[], str] | None = None,
    ) -> T:
        """What ``found()`` returns once it is not None, re-checked on each arrival; a
        :class:`Failed` naming ``what`` after ``timeout_s``, and what ``instead()`` says the
        kit saw instead, when given."""
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                while (hit := found()) is None:
                    self._check_alive()
                    with contextlib.suppress(TimeoutError):
                        # Woken by arrivals; the short wait also notices a dead process.
                        await asyncio.wait_for(self._changed.wait(), 0.5)
                return hit
        except TimeoutError:
            saw = f"; {instead()}" if instead is not None else ""
            raise Failed(f"no {what} within {timeout_s:g} s{saw}") from None

    async def event_of(
        self, ex: Exchange, event: str, timeout_s: float, *, at_once: bool = True
    ) -> Event:
        """``ex``'s ``event``; a :class:`Failed` saying what the agent did instead: at once
        when it ended the task otherwise (another outcome, or a result), else after
        ``timeout_s``. Not ``at_once``: only after ``timeout_s``, saying no more (for a
        clause that says what it saw in words of its own)."""

        def found() -> Event | str | None:
            if hit := ex.events_of(event):
                return hit[0]
            return ex.ended_otherwise(event) if at_once else None

        instead = ex.said if at_once else None
        hit = await self.until(found, timeout_s, f"{event} event", instead=instead)
        if isinstance(hit, str):
            raise Failed(f"no {event} event: {hit}")
        return hit

    async def poll(
        self, check: Callable[[], Awaitable[T | None]], timeout_s: float, every_s: float = 0.1
    ) -> T | None:
        """What ``await check()`` returns once it is not None, for state that announces no
        change of its own (a KV record written by the coordinator); None after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while (found := await check()) is None:  # noqa: ASYNC110 - nothing to await
                    await asyncio.sleep(every_s)
                return found
        return None

    async def quiet(self, seconds: float = QUIET_S) -> None:
        """Let anything still under way arrive before counting what did."""
        await self.broker.flush()
        await asyncio.sleep(seconds)

    def _check_alive(self) -> None:
        if self.expect_exit or self.process is None:
            return
        if (code := self.process.exited()) is not None:
            raise Failed(f"the agent process exited ({code}):\n{self.process.tail()}")

    # -- the registry ---------------------------------------------------------------------
    async def card(self) -> AgentCard:
        """The agent's card as stored now (a Failed when missing or unreadable)."""
        cards = await self.broker.bucket(self.names.agents_bucket, AgentCard)
        try:
            entry = await cards.get(self.agent_id)
        except DecodeError as exc:
            raise Failed(f"the card in {self.names.agents_bucket} is not a card: {exc}") from None
        if entry is None:
            raise Failed(f"no card for {self.agent_id!r} in {self.names.agents_bucket}")
        return entry.value

    async def executions(self) -> Bucket[Execution]:
        return await self.broker.bucket(self.names.executions_bucket, Execution)

    def execution_key(self, task: Task, *, caller: str | None = None) -> str:
        """The key of the agent's record of ``task`` (as ``caller`` sent it, when given)."""
        return execution_key(caller or task.caller, task.message_id, self.agent_id)

    async def execution(self, task: Task, *, caller: str | None = None) -> Execution | None:
        """The agent's record of ``task`` in ``reach_executions``, or None."""
        key = self.execution_key(task, caller=caller)
        try:
            entry = await (await self.executions()).get(key)
        except DecodeError as exc:
            raise Failed(f"execution record {key} is unreadable: {exc}") from None
        return entry.value if entry else None
