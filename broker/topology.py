"""The declarative description of every stream and bucket Agent-Reach uses, with the
design's defaults; :mod:`agentreach.broker.provisioning` brings a server to it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from nats.js import api

from agentreach.broker.limits import StorageLimits
from agentreach.broker.names import Names
from agentreach.broker.replication import AUTO, Replicas
from agentreach.envelopes import Priority

DAY = 24 * 3600.0
KV_DUPLICATE_WINDOW_S = 120.0  # nats-py's for a bucket (or its ttl, when shorter)
# REACH_EVENTS drops an event whose Nats-Msg-Id it stored this recently: an agent's second
# report of one attempt (a run of it again, after a redelivery) is not stored.
EVENTS_DUPLICATE_WINDOW_S = 120.0
DEAD_LETTERS_KEPT_S = 30 * DAY  # REACH_DLQ, and what settled each letter (REACH_SETTLED)
MANUAL_KEPT_S = 8 * DAY  # a manual-review item may wait a week, then is kept a day
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
    max_bytes: int = -1
    discard_new: bool = False  # when full, refuse a write instead of dropping the oldest
    deny_delete: bool = False  # history nobody may edit (events, dead letters)
    description: str = ""
    replicas: int = 1
    placement_tags: tuple[str, ...] = ()  # on servers carrying every one of these tags

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
            max_bytes=self.max_bytes,
            discard=api.DiscardPolicy.NEW
            if self.discard_new or self.discard_new_per_subject
            else api.DiscardPolicy.OLD,
            discard_new_per_subject=self.discard_new_per_subject,
            deny_delete=self.deny_delete,
            allow_direct=True,
            num_replicas=self.replicas,
            placement=_placement(self.placement_tags),
        )


@dataclass(frozen=True, kw_only=True)
class BucketSpec:
    """One KV bucket."""

    name: str
    history: int = 1
    ttl_s: float = 0.0  # 0 = keys never expire
    max_value_bytes: int = -1  # a larger value is refused
    max_bytes: int = -1  # full, a new value is refused
    description: str = ""
    replicas: int = 1
    placement_tags: tuple[str, ...] = ()

    @property
    def stream(self) -> str:
        """The stream that holds the bucket."""
        return f"KV_{self.name}"

    def config(self) -> api.StreamConfig:
        """The bucket's stream, as nats-py's ``create_key_value`` makes it, and then ours:
        no roll-ups and no purges (a writer of one key could wipe the whole bucket; we delete
        keys, we never purge them), the replicas and the placement. Made in one step: on a
        cluster a change right after the creation waits for the new stream's leader."""
        return api.StreamConfig(
            name=self.stream,
            description=self.description or None,
            subjects=[f"$KV.{self.name}.>"],
            allow_direct=True,
            allow_rollup_hdrs=False,
            allow_msg_ttl=True,
            deny_delete=True,
            deny_purge=True,
            discard=api.DiscardPolicy.NEW,
            duplicate_window=min(KV_DUPLICATE_WINDOW_S, self.ttl_s or KV_DUPLICATE_WINDOW_S),
            max_age=self.ttl_s,
            max_consumers=-1,
            max_msgs=-1,
            max_msgs_per_subject=self.history,
            max_msg_size=self.max_value_bytes,
            max_bytes=self.max_bytes,
            num_replicas=self.replicas,
            storage=api.StorageType.FILE,
            placement=_placement(self.placement_tags),
        )


def _placement(tags: tuple[str, ...]) -> api.Placement | None:
    return api.Placement(tags=list(tags)) if tags else None


@dataclass(frozen=True, kw_only=True)
class ObjectStoreSpec:
    """One Object Store bucket (claim-checked payloads)."""

    name: str
    ttl_s: float = 0.0
    max_bytes: int = -1  # when full, a put is refused (an object store discards new)
    description: str = ""
    replicas: int = 1
    placement_tags: tuple[str, ...] = ()

    @property
    def stream(self) -> str:
        """The stream that holds the store."""
        return f"OBJ_{self.name}"

    def config(self) -> api.ObjectStoreConfig:
        return api.ObjectStoreConfig(
            bucket=self.name,
            description=self.description or None,
            ttl=self.ttl_s or None,
            max_bytes=self.max_bytes,
            storage=api.StorageType.FILE,
            replicas=self.replicas,
            placement=_placement(self.placement_tags),
        )


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Every stream and bucket, and the replica setting they were made for: ``auto`` is
    resolved by :func:`~agentreach.broker.provisioning.provision` on the server at hand;
    None means each spec's own ``replicas``."""

    streams: tuple[StreamSpec, ...]
    buckets: tuple[BucketSpec, ...]
    objects: tuple[ObjectStoreSpec, ...] = ()
    replicas: Replicas | None = None

    @classmethod
    def default(
        cls,
        names: Names | None = None,
        *,
        executions_ttl_s: float = DAY,
        queue_capacity: Mapping[Priority, int] | None = None,
        replicas: Replicas = AUTO,
        work_tags: Sequence[str] = (),
        audit_days: float = 30.0,
        payload_days: float = 30.0,
        limits: StorageLimits | None = None,
    ) -> Topology:
        """Every stream and bucket of SPEC.md, with the design's defaults.

        Each agent's dispatch subject holds at most ``queue_capacity[priority]``
        messages (queued or unacknowledged); the broker refuses more. ``work_tags`` place
        the streams that carry work (tasks, dispatch, dead letters) on servers with those
        tags: the durability profile. ``limits`` bound what the streams and buckets keep.
        """
        n = names or Names()
        lim = limits or StorageLimits()
        small = lim.small_value_bytes
        capacity = {**DEFAULT_QUEUE_CAPACITY, **(queue_capacity or {})}
        work = tuple(work_tags)
        dispatch = tuple(
            StreamSpec(
                name=stream,
                subjects=(n.dispatch_wildcard(priority),),
                retention="workqueue",
                max_msgs_per_subject=capacity[priority],
                discard_new_per_subject=True,
                description=f"Tasks dispatched to one agent, priority {priority}",
                placement_tags=work,
            )
            for priority, stream in n.dispatch_streams.items()
        )
        return cls(
            streams=(
                StreamSpec(
                    name=n.tasks_stream,
                    subjects=(n.tasks_wildcard,),
                    retention="workqueue",
                    max_bytes=lim.tasks_bytes,
                    discard_new=True,
                    # One caller's flood is refused at its publish, past its own backlog.
                    max_msgs_per_subject=lim.tasks_per_subject,
                    discard_new_per_subject=lim.tasks_per_subject > 0,
                    description="Task intake: reach.task.<topic>",
                    placement_tags=work,
                ),
                *dispatch,
                StreamSpec(
                    name=n.events_stream,
                    deny_delete=True,
                    subjects=(n.events_wildcard,),
                    max_age_s=7 * DAY,
                    duplicate_window_s=EVENTS_DUPLICATE_WINDOW_S,
                    max_bytes=lim.events_bytes,
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
                    max_bytes=lim.workflows_bytes,
                    discard_new=True,
                    description="Workflow step replies, timers, signals and cancels",
                ),
                StreamSpec(
                    name=n.dlq_stream,
                    deny_delete=True,
                    subjects=(n.dlq_wildcard,),
                    max_age_s=DEAD_LETTERS_KEPT_S,
                    max_bytes=lim.dead_letters_bytes,
                    discard_new=True,  # a letter is kept by its message until there is room
                    duplicate_window_s=3600.0,
                    description="Dead letters: reach.dlq.<reason>.<topic>",
                    placement_tags=work,
                ),
                StreamSpec(
                    # A letter's state outlives REACH_EVENTS' week: a worker deployed later,
                    # or a replay on day 20, must still see that it was replayed.
                    name=n.settled_stream,
                    deny_delete=True,
                    subjects=(n.settled_wildcard,),
                    max_age_s=DEAD_LETTERS_KEPT_S,
                    max_bytes=lim.settled_bytes,
                    discard_new=True,
                    duplicate_window_s=3600.0,
                    description="Replayed and resolved events of dead letters, kept as the letters",
                    placement_tags=work,
                ),
                StreamSpec(
                    name=n.audit_stream,
                    deny_delete=True,
                    subjects=(n.audit_wildcard,),
                    max_age_s=audit_days * DAY,
                    max_bytes=lim.audit_bytes,
                    discard_new=True,
                    duplicate_window_s=3600.0,
                    description="One audit record per finished message",
                ),
            ),
            buckets=(
                BucketSpec(
                    name=n.agents_bucket,
                    max_value_bytes=lim.card_bytes,
                    description="Agent cards by agent_id",
                ),
                BucketSpec(
                    name=n.heartbeats_bucket, max_value_bytes=small, description="Agent heartbeats"
                ),
                BucketSpec(
                    name=n.liveness_bucket,
                    history=5,
                    max_value_bytes=small,
                    description="Agent liveness",
                ),
                BucketSpec(
                    name=n.leases_bucket,
                    max_value_bytes=small,
                    description="Coordinator duties that run once",
                ),
                BucketSpec(
                    name=n.workflows_bucket,
                    history=5,
                    ttl_s=7 * DAY,  # an instance is kept a week after its last change
                    description="Workflow instances: state, steps, outputs, deadlines",
                ),
                BucketSpec(
                    name=n.breakers_bucket,
                    history=5,
                    max_value_bytes=small,
                    description="Circuit breakers per agent.intent, isolation per agent",
                ),
                BucketSpec(
                    name=n.quotas_bucket,
                    # No ttl: a record dropped early would hand its caller a full bucket.
                    max_value_bytes=small,
                    description="Token buckets per caller, shared by every coordinator replica",
                ),
                BucketSpec(
                    name=n.manual_bucket,
                    history=5,
                    ttl_s=MANUAL_KEPT_S,
                    description="Tasks waiting for a person (manual review), by message_id",
                ),
                BucketSpec(
                    name=n.executions_bucket,
                    ttl_s=executions_ttl_s,
                    max_value_bytes=lim.record_bytes,
                    max_bytes=lim.records_bytes,
                    description="Execution records by message_id (exactly-once effect)",
                ),
            ),
            objects=(
                ObjectStoreSpec(
                    name=n.payloads_bucket,
                    ttl_s=payload_days * DAY,
                    max_bytes=lim.payloads_bytes,
                    description="Claim-checked payloads and results too large to travel inline",
                ),
            ),
        ).with_replicas(replicas)

    def with_replicas(self, replicas: Replicas) -> Topology:
        """Every stream and bucket at ``replicas`` (``auto`` is kept as the setting, for
        provisioning to resolve)."""
        if replicas == AUTO:
            return dataclasses.replace(self, replicas=AUTO)
        count = int(replicas)
        return Topology(
            streams=tuple(dataclasses.replace(s, replicas=count) for s in self.streams),
            buckets=tuple(dataclasses.replace(b, replicas=count) for b in self.buckets),
            objects=tuple(dataclasses.replace(o, replicas=count) for o in self.objects),
            replicas=replicas,
        )


def queue_caps(names: Names, queue_capacity: Mapping[Priority, int]) -> Topology:
    """Only the dispatch streams, with these per-agent queue capacities."""
    full = Topology.default(names, queue_capacity=queue_capacity)
    dispatch = set(names.dispatch_streams.values())
    streams = tuple(s for s in full.streams if s.name in dispatch)
    return Topology(streams=streams, buckets=(), replicas=full.replicas)
