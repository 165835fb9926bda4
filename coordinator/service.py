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
import functools
import importlib.metadata
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import structlog

from agentreach.broker import (
    Broker,
    ClaimCheck,
    ConsumerSpec,
    Provisioner,
    PullConsumer,
    Unavailable,
    bind,
    provision,
)
from agentreach.broker.failover import until_answered
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator import consumers
from agentreach.coordinator.calls import Calls
from agentreach.coordinator.config import CoordinatorConfig, shared_settings
from agentreach.coordinator.consumption import Consumption, Handler, TaskOf
from agentreach.coordinator.delivery.advisories import Advisories
from agentreach.coordinator.delivery.outcomes import Outcomes
from agentreach.coordinator.delivery.traces import TraceDesk
from agentreach.coordinator.delivery.unreported import Unreported
from agentreach.coordinator.desks import StatusDesk, desk_connection
from agentreach.coordinator.intake import Intake
from agentreach.coordinator.lease import Lease
from agentreach.coordinator.liveness.control import LivenessControl
from agentreach.coordinator.liveness.monitor import LivenessMonitor
from agentreach.coordinator.liveness.queue_expiry import QueueExpiry
from agentreach.coordinator.observability import (
    AfterFirstScrape,
    AgentTopics,
    AuditWriter,
    FlowMetrics,
    OpenLetters,
    Readiness,
    Sampled,
    StateCollector,
    Views,
    WorkflowCensus,
    new_registry,
    serving,
)
from agentreach.coordinator.observability.config_drift import config_digest
from agentreach.coordinator.protection.breaker_board import BreakerBoard
from agentreach.coordinator.protection.outcome_feed import follow_outcomes
from agentreach.coordinator.protection.queues import QueueDepths
from agentreach.coordinator.protection.quotas import CallerQuotas
from agentreach.coordinator.protection.rate_limits import RateLimiter
from agentreach.coordinator.protection.sealing import sealed_grants
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.coordinator.routing.fleet import Fleet
from agentreach.coordinator.routing.manual import ManualQueue
from agentreach.coordinator.routing.reload import RouteReloader
from agentreach.coordinator.routing.router import Router
from agentreach.coordinator.routing.run_once import RunOnce
from agentreach.coordinator.workflows.engine import WorkflowEngine
from agentreach.envelopes import new_id

log = structlog.get_logger("coordinator")
Loop = Callable[[PullConsumer], Awaitable[None]]  # consumes one bound consumer until cancelled

ADVISORY_BATCH = 16
RESTART_FIRST_S = 1.0
RESTART_CAP_S = 30.0


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
        self.breakers = BreakerBoard(
            broker,
            config.breakers,
            declared_deadline=self.directory.declared_deadline,
            gone=self.directory.gone,
            registered=lambda agent_id: agent_id in self.directory.cards,
        )
        self.queues = QueueDepths(broker, config.queues)
        fleet = Fleet(self.directory, self.breakers, self.queues, RateLimiter(config.rate_limits))
        grants = sealed_grants(broker, config.security)
        # Secured (the seal key): only the intents operators allowed an agent are routed to it.
        self.directory.enforce_allowances = grants.enabled
        self.desks = desk_connection(broker)  # what anyone may flood, off the main connection
        self.manual = ManualQueue(broker, config.manual)
        self.router = Router(broker, fleet, config.routing, grants, manual=self.manual)
        self.quotas = CallerQuotas(broker, config.rate_limits)  # a caller's tasks, signals
        self.workflows = WorkflowEngine(broker, config.workflows, grants=grants, quotas=self.quotas)
        self.liveness = LivenessMonitor(
            broker,
            config.liveness,
            self.directory,
            self.queues.slots,
            RunOnce(broker, grants),
            allowed=lambda task, agent_id: config.delivery.allowed(
                task, self.directory.cards.get(agent_id)
            ),
            probes=self.desks,
        )
        # A forgotten agent (its card deleted) is forgotten here too, with no restart.
        self.directory.on_forget(self.liveness.moves.forget, self.breakers.forget)
        self.queue_expiry = QueueExpiry(broker, config.queue_expiry, self.queues, grants)
        self.unreported = Unreported(broker, config.unreported, grants)
        self.routes = RouteReloader(
            self.router, Path(config_path) if config_path else None, self.replica_id
        )
        self.registry = new_registry()
        self._agent_topics = AgentTopics(self.directory)
        self.flow = FlowMetrics(
            self.registry,
            self._serves,
            topics=self._agent_topics.shared,
            workflows=lambda: self.workflows.specs,
            rule_reasons=lambda: self.router.routing.dead_letter_reasons(),
            names=broker.names,
            topic_labels=config.metrics.topic_labels,
        )
        self.census = WorkflowCensus(broker)
        self.readiness = Readiness(broker)
        self._sampled = Sampled(broker, OpenLetters(broker))
        lease = functools.partial(Lease, broker, holder=self.replica_id, ttl_s=config.lease_ttl_s)
        self._lease, self._manual_lease = lease("liveness"), lease("manual")
        self._expiry_lease = lease("queue_expiry")
        views = Views(
            directory=self.directory,
            breakers=lambda: self.breakers.records,
            queues=self.queues,
            census=self.census,
            ready=lambda: self.readiness.ready,
            leases_held=lambda: {duty: lease.held for duty, lease in self._duties()},
            held=self.router.held_by_topic,
            info={"replica": self.replica_id, "version": _version(), "prefix": broker.names.prefix},
        )
        self.registry.register(StateCollector(views, self._sampled))
        self.metrics_url: str | None = None
        self.claim_check = ClaimCheck(broker, config.claim_check.threshold_bytes)
        self._calls = Calls(self.desks, self.claim_check)
        self._intake = Intake(
            broker,
            self.router,
            self.workflows,
            self.quotas,
            on_taken=self.flow.taken_in,
            claim_check=self.claim_check,
            priorities=self.directory.priorities,
            elsewhere=lambda topic: topic in self._sampled.workflows_elsewhere,
        )
        self.directory.on_card(self._intake.card_seen)
        self._outcomes = Outcomes(broker, self.router, self.directory, config.delivery, grants)
        self._advisories = Advisories(broker, grants)
        self._control = LivenessControl(config.liveness, self.liveness)
        self._topology = config.topology(broker.names)
        self._provisioner = Provisioner(broker, self._topology)
        self._consumption = Consumption(broker, self._provisioner)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Serve until cancelled; ``ready`` is set once every loop is consuming."""
        # Every stream and bucket, with this config's per-agent queue capacities (the broker
        # enforces them); idempotent, so replicas and restarts may all do it.
        metrics = serving(self.config.metrics, self.registry, self.readiness)
        async with self.desks, metrics as http:
            if http is not None:
                self.metrics_url = http.url
                log.info("metrics and health served", url=f"{http.url}metrics")
            await provision(self.broker, self._topology)
            self.readiness.provisioned = True
            try:
                await self._serve(ready)
            finally:  # what was pulled and not yet handled goes back at once, to a replica
                for consumer in self.readiness.consumers:
                    await consumer.close()
                await self._calls.stop()

    async def _serve(self, ready: asyncio.Event | None) -> None:
        async with asyncio.TaskGroup() as group:
            await self._follow_views(group)
            _keep(group, "liveness", lambda: self._lease.hold(self.liveness.run))
            _keep(group, "stream-sizes", self._sampled.run)
            # People's answers to manual-review items are carried out once, by one replica.
            _keep(group, "manual", lambda: self._manual_lease.hold(self.manual.run))
            # Tasks left past their ttl in agents' queues, and attempts acknowledged and never
            # reported, are ended once, by one replica.
            _keep(group, "queue-expiry", lambda: self._expiry_lease.hold(self._expire))
            await self._answer_requests()
            consumers: list[PullConsumer] = []
            for spec, loop in self._loops():
                consumer = await bind(self.broker, spec, on_missing=self._provisioner.ensure)
                consumers.append(consumer)
                _keep(group, spec.durable, functools.partial(loop, consumer))
            self.readiness.consumers = consumers
            # Now and after each outage; a retired workflow's instances on their own definition.
            await until_answered(self.workflows.resume_all, waiting_for="the workflow records")
            _keep(group, "workflow-resume", self.workflows.resume_after_outages)
            for connection in (self.broker, self.desks):  # its subscriptions are on the server
                await connection.flush()  # before it says so
            self.readiness.serving = True
            log.info(
                "coordinator serving",
                replica=self.replica_id,
                workflows=sorted(self.workflows.specs),
            )
            if ready is not None:
                ready.set()

    async def _follow_views(self, group: asyncio.TaskGroup) -> None:
        """Start what every replica keeps current, each ready before routing begins."""
        views = {
            "directory": self.directory.follow,
            "breakers": self.breakers.run,
            "queues": self.queues.run,
            "workflow-census": self.census.follow,
        }
        for name, follow in views.items():
            view_ready = asyncio.Event()
            _keep(group, name, functools.partial(follow, view_ready))
            await view_ready.wait()
        outcomes_feed = functools.partial(
            follow_outcomes,
            self.broker,
            since_s=self.config.breakers.window_s,
            handlers=(self.breakers.record_outcome, self.queues.finished),
        )
        _keep(group, "outcome-feed", outcomes_feed)
        _keep(group, "routes", lambda: self.routes.watch(self.config.routing.reload_poll_s))

    async def _answer_requests(self) -> None:
        """The desks (see :mod:`.desks`)."""
        names, desk, control = self.broker.names, self.desks.desk, self._control
        await desk(names.registrations, control.on_register, per_s=5000, queue="coordinators")
        await desk(names.clear, control.on_clear, per_s=100)  # the judge answers
        await desk(names.routes_reload, self.routes.on_request, per_s=100)
        await desk(names.status, StatusDesk(self.status).on_request, per_s=2000)
        traces = TraceDesk(self.broker)
        await desk(names.trace_requests, traces.on_request, per_s=2000, queue="coordinators")
        await desk(names.calls_wildcard, self._calls.on_call, per_s=5000, queue="coordinators")
        await self._calls.start()

    def _loops(self) -> list[tuple[ConsumerSpec, Loop]]:
        names, config, consume = self.broker.names, self.config, self._consume
        after = AfterFirstScrape(self.flow, self.readiness)
        fold = functools.partial(self._consumption.fold, batch=config.metrics.batch, counter=after)
        loops: list[tuple[ConsumerSpec, Loop]] = [
            (
                consumers.intake(names, config),
                consume(config.intake.batch, self._intake.handle, self._intake.task_of),
            ),
            (
                consumers.outcomes(names, config),
                consume(config.delivery.batch, self._outcomes.handle),
            ),
            (consumers.advisories(names), consume(ADVISORY_BATCH, self._advisories.handle)),
            (consumers.workflows(names), consume(config.delivery.batch, self.workflows.handle)),
            (consumers.metrics(names), fold),
        ]
        if config.audit.enabled:
            writer = AuditWriter(self.broker)
            loops.append((consumers.audit(names), consume(config.audit.batch, writer.handle)))
        return loops

    def _consume(self, batch: int, handle: Handler, task_of: TaskOf | None = None) -> Loop:
        run = self._consumption.run
        return functools.partial(run, batch=batch, handle=handle, task_of=task_of)

    def _serves(self, topic: str) -> bool:
        """Whether an agent (in its share) or a workflow serves ``topic``: a metric label."""
        return topic in self._agent_topics.shared() or self.workflows.serves(topic)

    def status(self) -> dict[str, object]:
        """What ``reach.ctl.status`` answers: this replica, and whether it is ready."""
        return {
            "replica": self.replica_id,
            "ready": self.readiness.ready,
            "why_not_ready": self.readiness.why_not(),
            "version": _version(),
            "prefix": self.broker.names.prefix,
            "duties": [duty for duty, lease in self._duties() if lease.held],
            "metrics": f"{self.metrics_url}metrics" if self.metrics_url else None,
            "enforces_allowances": self.directory.enforce_allowances,
            # Another replica configured apart (a rolling restart) leaves their tasks to it.
            "workflows": sorted(self.workflows.specs),
            "config_sha256": self._config_digest(),
        }

    def _config_digest(self) -> str:
        """Of the settings every replica should share, as they run: the routing as last
        reloaded."""
        running = msgspec.structs.replace(self.config, routing=self.router.routing)
        return config_digest(shared_settings(running))

    async def _expire(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.queue_expiry.run(), name="queue-expiry")
            group.create_task(self.unreported.run(), name="unreported")

    def _duties(self) -> tuple[tuple[str, Lease], ...]:
        """The duties one replica runs at a time, each under its lease."""
        return (
            ("liveness", self._lease),
            ("manual", self._manual_lease),
            ("queue_expiry", self._expiry_lease),
        )

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


@functools.cache  # it reads the package's metadata files: a millisecond a status answer
def _version() -> str:
    try:
        return importlib.metadata.version("agentreach")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _keep(group: asyncio.TaskGroup, name: str, loop: Callable[[], Awaitable[None]]) -> None:
    """Run ``loop`` in ``group`` for good: one that fails (a bug, an error nobody caught)
    is said loudly and started again after a pause, instead of stopping every other loop
    of the service with it."""

    async def kept() -> None:
        pause_s = RESTART_FIRST_S
        while True:
            try:
                await loop()
                return
            except Unavailable as exc:  # a cluster electing a leader, or without a quorum
                log.warning("a coordinator loop waits for JetStream", loop=name, error=str(exc))
            except Exception:
                log.exception("a coordinator loop failed; starting it again", loop=name)
            await asyncio.sleep(pause_s)
            pause_s = min(RESTART_CAP_S, pause_s * 2)

    group.create_task(kept(), name=name)
