"""The coordinator service: shared work through durable consumers, no private state.

Every replica binds the same durable consumers, so JetStream spreads intake and
outcome messages across them; a replica that dies leaves its unacknowledged
messages to be redelivered to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import structlog
from agentreach.broker import Broker, BrokerError, provision
from agentreach.broker.consume import ConsumerSpec, batches, bind
from agentreach.broker.tasks import cancel_and_wait
from agentreach.broker.topology import queue_caps
from agentreach.coordinator.advisories import Advisories
from agentreach.coordinator.breakers import BreakerBoard
from agentreach.coordinator.config import CoordinatorConfig
from agentreach.coordinator.directory import AgentDirectory
from agentreach.coordinator.feed import follow_outcomes
from agentreach.coordinator.intake import Intake
from agentreach.coordinator.lease import Lease
from agentreach.coordinator.liveness import LivenessMonitor
from agentreach.coordinator.outcomes import OUTCOME_EVENTS, Outcomes
from agentreach.coordinator.queues import QueueDepths
from agentreach.coordinator.router import Router
from agentreach.coordinator.routes import RouteReloader
from agentreach.coordinator.tokens import TokenBucket
from agentreach.coordinator.workflows import WorkflowEngine
from agentreach.envelopes import RegisterReply, new_id
from nats.aio.msg import Msg

from agentreach import envelopes

log = structlog.get_logger("coordinator")

# A handler returns None when the message is settled, or seconds until it should come back.
Handler = Callable[[Msg], Awaitable[float | None]]
RETRY_DELAY_S = 1.0
BUG_DELAY_S = 5.0


class Coordinator:
    """Routes intake tasks to agents and dead-letters what cannot complete.

    async with Coordinator(broker).running():
        ...  # serving until the block exits
    """

    def __init__(
        self,
        broker: Broker,
        config: CoordinatorConfig | None = None,
        *,
        config_path: Path | str | None = None,
    ) -> None:
        self.broker = broker
        self.config = config or CoordinatorConfig()
        self.directory = AgentDirectory(broker)
        self.breakers = BreakerBoard(broker, self.config.breakers)
        self.queues = QueueDepths(broker, self.config.queues)
        self.router = Router(
            broker, self.directory, self.config, breakers=self.breakers, queues=self.queues
        )
        self.workflows = WorkflowEngine(broker, self.config.workflows)
        self._intake = Intake(broker, self.router, self.workflows)
        self._outcomes = Outcomes(broker, self.router, self.directory, self.config)
        self._advisories = Advisories(broker)
        self.liveness = LivenessMonitor(broker, self.config)
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}-{new_id()[-8:]}"
        self.routes = RouteReloader(
            self.router, Path(config_path) if config_path else None, self.replica_id
        )
        self._registrations = TokenBucket(
            self.config.registration_rate, self.config.registration_burst
        )

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Serve until cancelled; ``ready`` is set once every loop is consuming."""
        names = self.broker.names
        intake = ConsumerSpec(
            stream=names.tasks_stream,
            durable=names.coordinator_intake,
            filter_subjects=(names.tasks_wildcard,),
            ack_wait_s=self.config.intake_ack_wait_s,
        )
        outcomes = ConsumerSpec(
            stream=names.events_stream,
            durable=names.coordinator_outcomes,
            filter_subjects=tuple(names.events_of_kind(e) for e in OUTCOME_EVENTS),
        )
        workflows = ConsumerSpec(
            stream=names.workflows_stream,
            durable=names.coordinator_workflows,
            filter_subjects=(names.workflows_wildcard,),
            max_ack_pending=-1,  # timers wait here, held back until due
        )
        advisories = ConsumerSpec(
            stream=names.advisories_stream,
            durable=names.coordinator_advisories,
            filter_subjects=names.max_deliveries_advisories,
        )
        # The per-agent queue capacities are this config's: the broker enforces them.
        await provision(self.broker.js, queue_caps(names, self.config.queues.capacities))
        async with asyncio.TaskGroup() as group:
            views = {
                "directory": self.directory.follow,
                "breakers": self.breakers.run,
                "queues": self.queues.run,
            }
            for name, follow in views.items():
                view_ready = asyncio.Event()
                group.create_task(follow(view_ready), name=name)
                await view_ready.wait()
            outcomes_feed = follow_outcomes(
                self.broker,
                since_s=self.config.breakers.window_s,
                handlers=(self.breakers.record_outcome, self.queues.finished),
            )
            group.create_task(outcomes_feed, name="outcome-feed")
            group.create_task(self.routes.watch(self.config.routes_poll_s), name="routes")
            lease = Lease(self.broker, "liveness", self.replica_id, ttl_s=self.config.lease_ttl_s)
            group.create_task(lease.hold(self.liveness.run), name="liveness")
            nc = self.broker.nc
            await nc.subscribe(names.register, queue="coordinators", cb=self._on_register)
            await nc.subscribe(names.clear, queue="coordinators", cb=self._on_clear)
            await nc.subscribe(names.routes_reload, cb=self.routes.on_request)  # every replica
            loops = (
                (intake, self.config.intake_batch, self._intake.handle),
                (outcomes, self.config.outcome_batch, self._outcomes.handle),
                (advisories, 16, self._advisories.handle),
                (workflows, self.config.outcome_batch, self.workflows.handle),
            )
            for spec, batch, handle in loops:
                sub = await bind(self.broker.js, spec)
                group.create_task(_consume(sub, batch, handle), name=spec.durable)
            if self.config.workflows:
                await self.workflows.resume_all()
            log.info("coordinator serving", url=self.broker.url)
            if ready is not None:
                ready.set()

    async def _on_register(self, msg: Msg) -> None:
        wait_s = self._registrations.take()
        reply = RegisterReply(ok=wait_s == 0.0, retry_after_ms=int(wait_s * 1000) + 1)
        if not reply.ok:
            log.info("too many registrations; asked to retry", retry_after_ms=reply.retry_after_ms)
        await msg.respond(envelopes.encode(reply))

    async def _on_clear(self, msg: Msg) -> None:
        agent_id = msg.data.decode(errors="replace")
        cleared = await self.liveness.clear(agent_id)
        await msg.respond(b"cleared" if cleared else b"unknown agent")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Coordinator]:
        """Run in the background for the duration of the block."""
        ready = asyncio.Event()
        task = asyncio.create_task(self.run(ready), name="coordinator")
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()  # raises whatever stopped it before it was ready
        try:
            yield self
        finally:
            await cancel_and_wait(task)
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]


async def _consume(sub: object, batch: int, handle: Handler) -> None:
    async for messages in batches(sub, size=batch):  # type: ignore[arg-type]
        await asyncio.gather(*(_settle(msg, handle) for msg in messages))


async def _settle(msg: Msg, handle: Handler) -> None:
    """Handle, then ack; a broker failure leaves the message to come back later."""
    try:
        retry_in_s = await handle(msg)
    except BrokerError as exc:
        await _later(msg, RETRY_DELAY_S, "broker error, will retry", error=str(exc))
        return
    except Exception:  # a bug must not stop the service; the message comes back later
        await _later(msg, BUG_DELAY_S, "unexpected error, will retry", exc_info=True)
        return
    if retry_in_s is None:
        await msg.ack()
    else:
        with contextlib.suppress(Exception):
            await msg.nak(delay=retry_in_s)


async def _later(msg: Msg, delay_s: float, why: str, **fields: object) -> None:
    log.warning(why, subject=msg.subject, **fields)
    with contextlib.suppress(Exception):
        await msg.nak(delay=delay_s)
