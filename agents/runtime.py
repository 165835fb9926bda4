"""A running agent: registration, then one consumer and worker pool per priority (each
handler's capacity shared by the three), heartbeats, presence and a watchdog, until a
drained stop."""

from __future__ import annotations

import asyncio
import contextlib
import random
from types import TracebackType
from typing import TYPE_CHECKING, Self

from agentreach.agents.claims import Claims
from agentreach.agents.drain import drain
from agentreach.agents.errors import AgentConfigError, AgentIdInUse
from agentreach.agents.execution import Executor
from agentreach.agents.heartbeats import Heartbeats, Load
from agentreach.agents.registration import (
    await_slot,
    mark_card,
    restore_card,
    write_card,
)
from agentreach.agents.slots import Room, WorkerPool
from agentreach.agents.watchdog import Watchdog
from agentreach.broker import (
    Broker,
    BrokerError,
    ClaimCheck,
    ConsumerSpec,
    Delivery,
    Entry,
    PullConsumer,
    bind,
    wait_provisioned,
)
from agentreach.broker.errors import honour_cancellation, pause
from agentreach.broker.failover import until_answered
from agentreach.broker.presence import Presence
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes import PRIORITIES, AgentCard, Execution, Priority
from agentreach.logs import get_logger

if TYPE_CHECKING:
    from agentreach.agents.agent import Agent

log = get_logger("agents")

FETCH_WAIT_S = 0.5
PRESENCE_CHECK_S = 0.5
# A stop waits this long for a lost connection to come back to mark the card stopped.
STOP_RECONNECT_S = 1.0
CARD_CHECK_S = 1.0  # how soon after a reconnect the card is looked for (reconnects are counted)
CARD_LOOK_BEATS = 4  # and every this many heartbeat intervals: deleted or overwritten by hand
# Deliveries held per slot: while a handler runs, the next task of its slot is in hand and
# the last one's outcome is recorded and reported (three round trips no slot waits for).
IN_HAND_PER_SLOT = 2


class AgentRuntime:
    """One process serving an :class:`Agent`; made by ``Agent.running()``."""

    def __init__(self, agent: Agent, broker: Broker) -> None:
        self.agent = agent
        self.broker = broker
        self.card: AgentCard | None = None
        self._registered: Entry[AgentCard] | None = None
        self.heartbeats: Heartbeats | None = None
        self._stopping = asyncio.Event()
        self._closed = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        capacities = {topic: spec.intent.capacity for topic, spec in agent.handlers.items()}
        self._room = Room(capacities, stopping=self._stopping)  # where handlers run
        self._hands = {p: WorkerPool(agent.capacity * IN_HAND_PER_SLOT) for p in PRIORITIES}
        self._executor: Executor
        self._presence: Presence | None = None
        self._duties: list[asyncio.Task[None]] = []
        self._consumers: dict[Priority, PullConsumer] = {}
        # Set once a newer process of the id was found heartbeating: this one stops.
        self.replaced = asyncio.Event()
        self.replaced_by_epoch = 0
        self._stopped: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Self:
        if self._loops or self._closed.is_set():
            raise RuntimeError("an AgentRuntime runs once; call Agent.running() again")
        agent = self.agent
        self._check_credentials()
        if agent.startup_delay:
            # Spread the registrations of a fleet that starts at once.
            delay_s = random.uniform(0, agent.startup_delay)
            log.info(
                "registering after a random start-up delay",
                agent_id=agent.agent_id,
                delay_s=round(delay_s, 1),
                startup_delay=agent.startup_delay,
                hint="startup_delay=0 (reach agent --startup-delay 0) registers at once",
            )
            await asyncio.sleep(delay_s)
        await self._await_topology()
        await self._claim_identity()
        interval = await await_slot(self.broker, agent.agent_id) or agent.heartbeat_interval
        # Through a leader election or a lost majority: wait, saying so, as for the streams.
        names = self.broker.names
        self._registered = await until_answered(
            lambda: write_card(self.broker, agent.card(status="running")),
            waiting_for=f"the agent registry ({names.agents_bucket})",
        )
        self.card = self._registered.value
        executions = await until_answered(
            lambda: self.broker.bucket(names.executions_bucket, Execution),
            waiting_for=f"the bucket {names.executions_bucket}",
        )
        self._executor = Executor(
            agent,
            self.broker,
            Claims(executions, agent.agent_id, self.card.epoch),
            room=self._room,
            claim_check=ClaimCheck(self.broker, agent.claim_check_bytes),
        )
        self._consumers = {p: await bind(self.broker, self._consumer(p)) for p in PRIORITIES}
        self._start_duties(interval)
        self._loops = [
            asyncio.create_task(self._consume(p, consumer), name=f"{agent.agent_id}-{p}")
            for p, consumer in self._consumers.items()
        ]
        log.info(
            "agent serving",
            agent_id=agent.agent_id,
            epoch=self.card.epoch,
            topics=sorted(agent.handlers),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def stop(self) -> None:
        """Stop taking work, let running handlers finish, mark the card stopped (once,
        however many ask: the owner's exit, and a newer process fencing this one out)."""
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._stop())
        await self._stopped

    async def _stop(self) -> None:
        self._stopping.set()
        await _finish(self._loops, 0)
        for consumer in self._consumers.values():  # what was pulled and not taken comes back
            await consumer.close()
        await self._announce_drain()
        await drain(list(self._in_flight), self.agent.drain_timeout, self.agent.agent_id)
        await _finish(self._duties, 0)
        if await self.broker.connected_within(STOP_RECONNECT_S):
            with contextlib.suppress(BrokerError):
                await self._retire()
        else:  # each write would wait for the connection: a stop took 7 s
            log.warning(
                "NATS is unreachable: stopping without marking the card stopped; the"
                " coordinator will judge this agent gone by its missing heartbeats",
                agent_id=self.agent.agent_id,
            )
        if self._presence is not None:
            await self._presence.stop()
        self._closed.set()
        log.info("agent stopped", agent_id=self.agent.agent_id)

    # -- starting -----------------------------------------------------------------
    async def _await_topology(self) -> None:
        """Wait for the coordinator (or ``reach provision``) to have made what an agent uses:
        an agent started first, or together with it, waits instead of exiting."""
        names = self.broker.names
        await wait_provisioned(
            self.broker,
            streams=[*names.dispatch_streams.values(), names.tasks_stream, names.events_stream],
            buckets=[names.agents_bucket, names.heartbeats_bucket, names.executions_bucket],
        )

    def _check_credentials(self) -> None:
        """Creds of another agent, or of another role, would have every registration
        refused: say so now."""
        auth, agent_id = self.broker.auth, self.agent.agent_id
        if auth.role not in (None, "agent", "operator", "coordinator"):
            raise AgentConfigError(
                f"the creds are a {auth.role}'s ({auth.identity!r}), not an agent's: give"
                f" {agent_id!r} creds of its own (`reach auth agent {agent_id}`)"
            )
        if auth.role == "agent" and auth.identity not in (None, agent_id):
            raise AgentConfigError(
                f"the creds are for agent {auth.identity!r}, but this agent is {agent_id!r}:"
                f" give it creds of its own (`reach auth agent {agent_id}`) or the creds' id"
            )

    async def _claim_identity(self) -> None:
        """Answer for this agent id, refusing when another live process does already."""
        agent = self.agent
        self._presence = Presence(
            self.broker, agent.agent_id, version=_version(agent), tags=agent.tags
        )
        if await self._presence.someone_else_answers(timeout_s=PRESENCE_CHECK_S):
            raise AgentIdInUse(
                f"agent_id {agent.agent_id!r} is in use by another live process;"
                " stop it or start this one with another id"
            )
        await self._presence.start()

    def _start_duties(self, interval_s: float) -> None:
        agent = self.agent
        assert self.card is not None
        self.heartbeats = Heartbeats(
            self.broker,
            agent.agent_id,
            self.card.epoch,
            interval_s=interval_s,
            load=self._load,
            clock=agent.clock,
            on_replaced=self._on_replaced,
        )
        self.watchdog = Watchdog(agent.watchdog_threshold)
        self._duties = [
            asyncio.create_task(self.heartbeats.run(), name=f"{agent.agent_id}-heartbeats"),
            asyncio.create_task(self.watchdog.run(), name=f"{agent.agent_id}-watchdog"),
            asyncio.create_task(self._keep_card(interval_s), name=f"{agent.agent_id}-card"),
        ]

    def _on_replaced(self, epoch: int) -> None:
        """A newer process serves this id (this one was stalled, or cut off, meanwhile):
        take no more work, finish what runs, and stop (§3.4: one live process per id)."""
        self.replaced_by_epoch = epoch
        self.replaced.set()
        self._stopped = asyncio.ensure_future(self._stop())

    def replaced_error(self) -> AgentIdInUse:
        """What ``Agent.run`` and ``reach agent`` raise once :attr:`replaced` is set."""
        epoch = self.card.epoch if self.card else 0
        return AgentIdInUse(
            f"agent_id {self.agent.agent_id!r} was registered again by a newer process"
            f" (epoch {self.replaced_by_epoch}; this one's {epoch}): this process stopped"
        )

    async def _keep_card(self, interval_s: float) -> None:
        """Write the card again when the registry has none readable: a server that restarted
        on an empty store (looked at after each reconnect), a card deleted or overwritten by
        hand (looked at every few heartbeat intervals). Routing knows an agent by its card,
        and heartbeats alone do not make one. Until the registry is provisioned again, it is
        looked for again and again."""
        loop = asyncio.get_running_loop()
        seen, looked_at = self.broker.reconnects, loop.time()
        while True:
            await pause(CARD_CHECK_S)  # nothing to await: nats-py only counts them
            # The interval as it is now: a coordinator's control message may change it.
            every_s = self.heartbeats.interval_s if self.heartbeats else interval_s
            due = loop.time() - looked_at >= every_s * CARD_LOOK_BEATS
            if (self.broker.reconnects == seen and not due) or self.card is None:
                continue
            try:
                restored = await restore_card(self.broker, self.card)
            except BrokerError:
                continue  # the registry is not there (yet)
            seen, looked_at = self.broker.reconnects, loop.time()
            if restored is not None:
                self._registered = restored

    def _consumer(self, priority: Priority) -> ConsumerSpec:
        names = self.broker.names
        return ConsumerSpec(
            stream=names.dispatch_stream(priority),
            durable=names.agent_consumer(self.agent.agent_id, priority),
            filter_subjects=(names.dispatch(self.agent.agent_id, priority),),
            ack_wait_s=self.agent.ack_wait,
            max_ack_pending=self.agent.capacity * IN_HAND_PER_SLOT,
            max_deliver=self.agent.max_deliver,
        )

    async def _announce_drain(self) -> None:
        """Card ``draining`` while running handlers finish: the coordinator routes nothing
        more here, and moves at once what this process had not started (else it waited in
        the queue for the whole drain)."""
        if not self._in_flight or self._registered is None or not self.broker.connected:
            return
        with contextlib.suppress(BrokerError):
            if marked := await mark_card(self.broker, self._registered, "draining"):
                self._registered, self.card = marked, marked.value

    async def _retire(self) -> None:
        """Card ``stopped`` and heartbeat deleted: the coordinator knows at once that this
        process stopped rather than got lost. Neither is touched when a newer process of the
        id has registered meanwhile (this one was cut off, say): what it wrote stands."""
        if self._registered is None:
            return
        if (marked := await mark_card(self.broker, self._registered, "stopped")) is None:
            return
        self._registered, self.card = marked, marked.value
        if self.heartbeats is not None:
            await self.heartbeats.retire()

    # -- consuming ----------------------------------------------------------------
    async def _consume(self, priority: Priority, consumer: PullConsumer) -> None:
        hand = self._hands[priority]
        while not self._stopping.is_set():
            honour_cancellation()
            await hand.wait_free()
            # A failed fetch (the server restarting) is said once and retried with backoff.
            for delivery in await consumer.next_batch(hand.free, wait_s=FETCH_WAIT_S):
                hand.take()
                task = asyncio.create_task(self._handle(delivery, hand))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)

    async def _handle(self, delivery: Delivery, hand: WorkerPool) -> None:
        try:
            await self._executor.settle(delivery)
        except Exception:  # a bug here must not lose the message: it comes back later
            log.exception("task handling crashed; the message will be redelivered")
            with contextlib.suppress(Exception):
                await delivery.nak(5.0)
        finally:
            hand.give()

    def _load(self) -> Load:
        return Load(
            in_flight=self._room.running,
            free_slots=self._room.free,
            latency_ms=self._executor.latency.estimate_ms,
        )


def _version(agent: Agent) -> str:
    """A semantic version for the micro service: the handlers' one, if they agree on it."""
    versions = sorted({spec.intent.version for spec in agent.handlers.values()})
    return versions[0] if len(versions) == 1 and versions[0].count(".") == 2 else "0.0.0"


async def _finish(tasks: list[asyncio.Task[None]], timeout: float) -> int:
    """Wait up to ``timeout`` for ``tasks``, then cancel the rest; how many were cut."""
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    await cancel_and_wait(*pending)
    return len(pending)
