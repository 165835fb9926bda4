"""The declarative description of every stream and bucket, and idempotent provisioning.

``provision()`` creates what is missing and applies changed limits to what
exists, so running it again never fails. A change the server cannot apply in
place (a different retention policy, say) is a :class:`ProvisionError` that
names the stream and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import nats.js
import structlog
from nats.js import api

from agentreach.broker.connection import Broker
from agentreach.broker.errors import JetStreamError, ProvisionError, translate
from agentreach.broker.names import Names
from agentreach.envelopes import Priority

log = structlog.get_logger("broker.topology")

DAY = 24 * 3600.0
# Per-agent dispatch queue capacity per priority (P0 small: urgent work must not queue).
DEFAULT_QUEUE_CAPACITY: dict[Priority, int] = {"P0": 10, "P1": 200, "P2": 1000}


class Outcome(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, kw_only=True)
class StreamSpec:
    """One stream: the limits Agent-Reach manages on it."""

    name: str
    subjects: tuple[str, ...]
    retention: Literal["limits", "workqueue"] = "limits"
    max_age_s: float = 0.0  # 0 = unlimited
    duplicate_window_s: float = 120.0
    max_msgs_per_subject: int = -1
    discard_new_per_subject: bool = False
    description: str = ""

    def config(self) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            description=self.description or None,
            subjects=list(self.subjects),
            retention=api.RetentionPolicy(self.retention),
            storage=api.StorageType.FILE,
            max_age=self.max_age_s,
            duplicate_window=self.duplicate_window_s,
            max_msgs_per_subject=self.max_msgs_per_subject,
            discard=api.DiscardPolicy.NEW
            if self.discard_new_per_subject
            else api.DiscardPolicy.OLD,
            discard_new_per_subject=self.discard_new_per_subject,
            allow_direct=True,
        )


@dataclass(frozen=True, kw_only=True)
class BucketSpec:
    """One KV bucket."""

    name: str
    history: int = 1
    ttl_s: float = 0.0  # 0 = keys never expire
    description: str = ""

    def config(self) -> api.KeyValueConfig:
        return api.KeyValueConfig(
            bucket=self.name,
            description=self.description or None,
            history=self.history,
            ttl=self.ttl_s or None,
            storage=api.StorageType.FILE,
            direct=True,
        )


@dataclass(frozen=True, kw_only=True)
class Topology:
    streams: tuple[StreamSpec, ...]
    buckets: tuple[BucketSpec, ...]

    @classmethod
    def default(
        cls,
        names: Names | None = None,
        *,
        executions_ttl_s: float = DAY,
        queue_capacity: Mapping[Priority, int] | None = None,
    ) -> Topology:
        """Every stream and bucket of SPEC.md, with the design's defaults.

        Each agent's dispatch subject holds at most ``queue_capacity[priority]``
        messages (queued or unacknowledged); the broker refuses more.
        """
        n = names or Names()
        capacity = {**DEFAULT_QUEUE_CAPACITY, **(queue_capacity or {})}
        dispatch = tuple(
            StreamSpec(
                name=stream,
                subjects=(n.dispatch_wildcard(priority),),
                retention="workqueue",
                max_msgs_per_subject=capacity[priority],
                discard_new_per_subject=True,
                description=f"Tasks dispatched to one agent, priority {priority}",
            )
            for priority, stream in n.dispatch_streams.items()
        )
        return cls(
            streams=(
                StreamSpec(
                    name=n.tasks_stream,
                    subjects=(n.tasks_wildcard,),
                    retention="workqueue",
                    description="Task intake: reach.task.<topic>",
                ),
                *dispatch,
                StreamSpec(
                    name=n.events_stream,
                    subjects=(n.events_wildcard,),
                    max_age_s=7 * DAY,
                    description="Lifecycle events of every message",
                ),
                StreamSpec(
                    name=n.advisories_stream,
                    subjects=n.max_deliveries_advisories,
                    max_age_s=7 * DAY,
                    description="JetStream advisories the coordinator acts on",
                ),
                StreamSpec(
                    name=n.workflows_stream,
                    subjects=(n.workflows_wildcard,),
                    retention="workqueue",
                    description="Workflow step replies, timers, signals and cancels",
                ),
                StreamSpec(
                    name=n.dlq_stream,
                    subjects=(n.dlq_wildcard,),
                    max_age_s=30 * DAY,
                    duplicate_window_s=3600.0,
                    description="Dead letters: reach.dlq.<reason>.<topic>",
                ),
            ),
            buckets=(
                BucketSpec(name=n.agents_bucket, description="Agent cards by agent_id"),
                BucketSpec(name=n.heartbeats_bucket, description="Agent heartbeats"),
                BucketSpec(name=n.liveness_bucket, history=5, description="Agent liveness"),
                BucketSpec(name=n.leases_bucket, description="Coordinator duties that run once"),
                BucketSpec(
                    name=n.workflows_bucket,
                    history=5,
                    ttl_s=7 * DAY,  # an instance is kept a week after its last change
                    description="Workflow instances: state, steps, outputs, deadlines",
                ),
                BucketSpec(
                    name=n.breakers_bucket,
                    history=5,
                    description="Circuit breakers per agent.intent, isolation per agent",
                ),
                BucketSpec(
                    name=n.executions_bucket,
                    ttl_s=executions_ttl_s,
                    description="Execution records by message_id (exactly-once effect)",
                ),
            ),
        )


def queue_caps(names: Names, queue_capacity: Mapping[Priority, int]) -> Topology:
    """Only the dispatch streams, with these per-agent queue capacities."""
    full = Topology.default(names, queue_capacity=queue_capacity)
    dispatch = set(names.dispatch_streams.values())
    return Topology(streams=tuple(s for s in full.streams if s.name in dispatch), buckets=())


async def provision(broker: Broker, topology: Topology) -> dict[str, Outcome]:
    """Bring every stream and bucket to its spec; returns what happened to each."""
    js = broker.js
    outcomes: dict[str, Outcome] = {}
    for stream in topology.streams:
        outcomes[stream.name] = await _ensure_stream(js, stream.config())
    for bucket in topology.buckets:
        outcomes[bucket.name] = await _ensure_bucket(js, bucket)
    for name, outcome in outcomes.items():
        log.debug("provisioned", name=name, outcome=str(outcome))
    return outcomes


async def _existing(js: nats.js.JetStreamContext, stream: str) -> api.StreamConfig | None:
    try:
        return (await js.stream_info(stream)).config
    except nats.js.errors.NotFoundError:
        return None


async def _ensure_stream(js: nats.js.JetStreamContext, wanted: api.StreamConfig) -> Outcome:
    assert wanted.name is not None
    existing = await _existing(js, wanted.name)
    if existing is None:
        try:
            await js.add_stream(wanted)
        except nats.js.errors.APIError as exc:
            raise _provision_error(wanted.name, exc) from exc
        return Outcome.CREATED
    return await _update_if_changed(js, existing, wanted)


async def _ensure_bucket(js: nats.js.JetStreamContext, bucket: BucketSpec) -> Outcome:
    existing = await _existing(js, f"KV_{bucket.name}")
    if existing is None:
        try:
            await js.create_key_value(bucket.config())
        except nats.js.errors.APIError as exc:
            raise _provision_error(bucket.name, exc) from exc
        return Outcome.CREATED
    wanted = api.StreamConfig.from_response(existing.as_dict())
    wanted.max_msgs_per_subject = bucket.history
    wanted.max_age = bucket.ttl_s
    wanted.description = bucket.description or None
    return await _update_if_changed(js, existing, wanted)


_MANAGED = (
    "subjects",
    "retention",
    "max_age",
    "duplicate_window",
    "max_msgs_per_subject",
    "discard",
    "discard_new_per_subject",
    "description",
)
_IMMUTABLE = ("retention", "storage")


async def _update_if_changed(
    js: nats.js.JetStreamContext, existing: api.StreamConfig, wanted: api.StreamConfig
) -> Outcome:
    changed = [f for f in _MANAGED if _norm(getattr(existing, f)) != _norm(getattr(wanted, f))]
    if not changed:
        return Outcome.UNCHANGED
    for field in _IMMUTABLE:
        if field in changed:
            raise ProvisionError(
                f"stream {wanted.name}: {field} is {getattr(existing, field)} on the server"
                f" but the spec wants {getattr(wanted, field)}; the server cannot change it in"
                " place (delete the stream to recreate it)"
            )
    merged = api.StreamConfig.from_response(existing.as_dict())
    for field in changed:
        setattr(merged, field, getattr(wanted, field))
    try:
        await js.update_stream(merged)
    except nats.js.errors.APIError as exc:
        raise _provision_error(wanted.name, exc) from exc
    log.info("stream updated", stream=wanted.name, fields=changed)
    return Outcome.UPDATED


def _norm(value: object) -> object:
    if isinstance(value, list):
        return sorted(value)
    if value in (None, 0, 0.0, "", -1):
        return None
    return value


def _provision_error(name: str | None, exc: nats.js.errors.APIError) -> ProvisionError:
    broker_error = translate(exc)
    code = broker_error.err_code if isinstance(broker_error, JetStreamError) else None
    return ProvisionError(f"cannot provision {name}: {exc.description} (err_code={code})")
