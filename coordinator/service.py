"""The coordinator service: wires the wings together and runs their loops.

Every replica binds the same durable consumers, so JetStream spreads intake and
outcome messages across them; a replica that dies leaves its unacknowledged
messages to be redelivered to the others. The views each replica keeps (agents,
breakers, queue depths) are rebuilt from KV and streams at start; duties that must
run once (liveness) run under a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import structlog

from agentreach.broker import Broker, BrokerError, ConsumerSpec, Delivery, PullConsumer, bind
from agentreach.broker.tasks import cancel_and_wait
from agentreach.broker.topology import provision, queue_caps
from agentreach.coordinator.config import CoordinatorConfig
from agentreach.coordinator.delivery.advisories import Advisories
from agentreach.coordinator.delivery.outcomes import OUTCOME_EVENTS, Outcomes
from agentreach.coordinator.intake import Intake
from agentreach.coordinator.lease import Lease
from agentreach.coordinator.liveness.control import LivenessControl
from agentreach.coordinator.liveness.monitor import LivenessMonitor
from agentreach.coordinator.protection.breaker_board import BreakerBoard
from agentreach.coordinator.protection.outcome_feed import follow_outcomes
from agentreach.coordinator.protection.queues import QueueDepths
from agentreach.coordinator.protection.rate_limits import RateLimiter
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.coordinator.routing.fleet import Fleet
from agentreach.coordinator.routing.reload import RouteReloader
from agentreach.coordinator.routing.router import Router
from agentreach.coordinator.workflows.engine import WorkflowEngine
from agentreach.envelopes import new_id

log = structlog.get_logger("coordinator")

# A handler returns None when the message is settled, or seconds until it should come back.
Handler = Callable[[Delivery], Awaitable[float | None]]
RETRY_DELAY_S = 1.0
BUG_DELAY_S = 5.0
ADVISORY_BATCH = 16


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
        self.config = config = config or CoordinatorConfig()
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}-{new_id()[-8:]}"
        self.directory = AgentDirectory(broker)
        self.breakers = BreakerBoard(broker, config.breakers)
        self.queues = QueueDepths(broker, config.queues)
        fleet = Fleet(self.directory, self.breakers, self.queues, RateLimiter(config.rate_limits))
        self.router = Router(broker, fleet, config.routing)
        self.workflows = WorkflowEngine(broker, config.workflows)
        self.liveness = LivenessMonitor(broker, config.liveness)
        self.routes = RouteReloader(
            self.router, Path(config_path) if config_path else None, self.replica_id
        )
        self._intake = Intake(broker, self.router, self.workflows)
        self._outcomes = Outcomes(broker, self.router, self.directory, config.delivery)
        self._advisories = Advisories(broker)
        self._control = LivenessControl(config.liveness, self.liveness)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Serve until cancelled; ``ready`` is set once every loop is consuming."""
        # The per-agent queue capacities are this config's: the broker enforces them.
        await provision(self.broker, queue_caps(self.broker.names, self.config.queues.capacities))
        async with asyncio.TaskGroup() as group:
            await self._follow_views(group)
            lease = Lease(self.broker, "liveness", self.replica_id, ttl_s=self.config.lease_ttl_s)
            group.create_task(lease.hold(self.liveness.run), name="liveness")
            await self._answer_requests()
            for spec, batch, handle in self._loops():
                consumer = await bind(self.broker, spec)
                group.create_task(_consume(consumer, batch, handle), name=spec.durable)
            if self.config.workflows:
                await self.workflows.resume_all()
            log.info("coordinator serving", replica=self.replica_id)
            if ready is not None:
                ready.set()

    async def _follow_views(self, group: asyncio.TaskGroup) -> None:
        """Start what every replica keeps current, each ready before routing begins."""
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
        group.create_task(self.routes.watch(self.config.routing.reload_poll_s), name="routes")

    async def _answer_requests(self) -> None:
        names = self.broker.names
        await self.broker.subscribe(names.register, self._control.on_register, queue="coordinators")
        await self.broker.subscribe(names.clear, self._control.on_clear, queue="coordinators")
        await self.broker.subscribe(names.routes_reload, self.routes.on_request)  # every replica

    def _loops(self) -> list[tuple[ConsumerSpec, int, Handler]]:
        names, config = self.broker.names, self.config
        intake = ConsumerSpec(
            stream=names.tasks_stream,
            durable=names.coordinator_intake,
            filter_subjects=(names.tasks_wildcard,),
            ack_wait_s=config.intake.ack_wait_s,
        )
        outcomes = ConsumerSpec(
            stream=names.events_stream,
            durable=names.coordinator_outcomes,
            filter_subjects=tuple(names.events_of_kind(e) for e in OUTCOME_EVENTS),
        )
        advisories = ConsumerSpec(
            stream=names.advisories_stream,
            durable=names.coordinator_advisories,
            filter_subjects=names.max_deliveries_advisories,
        )
        workflows = ConsumerSpec(
            stream=names.workflows_stream,
            durable=names.coordinator_workflows,
            filter_subjects=(names.workflows_wildcard,),
            max_ack_pending=-1,  # timers wait here, held back until due
        )
        return [
            (intake, config.intake.batch, self._intake.handle),
            (outcomes, config.delivery.batch, self._outcomes.handle),
            (advisories, ADVISORY_BATCH, self._advisories.handle),
            (workflows, config.delivery.batch, self.workflows.handle),
        ]

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


async def _consume(consumer: PullConsumer, batch: int, handle: Handler) -> None:
    async for deliveries in consumer.batches(size=batch):
        await asyncio.gather(*(_settle(delivery, handle) for delivery in deliveries))


async def _settle(delivery: Delivery, handle: Handler) -> None:
    """Handle, then ack; a broker failure leaves the message to come back later."""
    try:
        retry_in_s = await handle(delivery)
    except BrokerError as exc:
        await _later(delivery, RETRY_DELAY_S, "broker error, will retry", error=str(exc))
        return
    except Exception:  # a bug must not stop the service; the message comes back later
        await _later(delivery, BUG_DELAY_S, "unexpected error, will retry", exc_info=True)
        return
    with contextlib.suppress(BrokerError):  # unsettled, it comes back after the ack wait
        if retry_in_s is None:
            await delivery.ack()
        else:
            await delivery.nak(retry_in_s)


async def _later(delivery: Delivery, delay_s: float, why: str, **fields: object) -> None:
    log.warning(why, subject=delivery.subject, **fields)
    with contextlib.suppress(BrokerError):
        await delivery.nak(delay_s)
