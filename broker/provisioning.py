"""Bringing a server to the topology: idempotent provisioning, re-provisioning what went
missing, and waiting until someone else (the coordinator) has provisioned.

``provision()`` creates what is missing and applies changed limits, replica counts and
placement to what exists, so running it again never fails. A change the server cannot apply
in place (a different retention policy, say) is a :class:`ProvisionError` that names the
stream and the field. Replicas are scaled in place: raising the setting turns R1 streams and
buckets into R3 without losing a message (a work-queue stream with consumers pauses about
ten seconds while it is re-mapped).

A service starting during a leader election, or while most of the cluster's nodes are down,
waits for JetStream to answer (see :func:`~agentreach.broker.failover.until_answered`), for
ever; a command waits ``patience_s``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js

from agentreach.broker.connection import Broker
from agentreach.broker.ensure import ensure_bucket, ensure_objects, ensure_stream
from agentreach.broker.errors import (
    BrokerError,
    JetStreamError,
    ProvisionError,
    translate,
    translated,
)
from agentreach.broker.failover import backoff_s, stream_names, unanswered, until_answered
from agentreach.broker.provisioned import Change, Provisioning, wait_settled
from agentreach.broker.replication import AUTO, NO_SUITABLE_PEERS, NOT_CLUSTERED, resolve_replicas
from agentreach.broker.topology import (
    BucketSpec,
    ObjectStoreSpec,
    Outcome,
    StreamSpec,
    Topology,
)
from agentreach.logs import get_logger

log = get_logger("broker.provisioning")

# How long a command (`reach provision`), or a running service bringing back what went
# missing, waits for JetStream to answer (a leader election) before it gives up.
PATIENCE_S = 30.0
PEERS_PATIENCE_S = 5.0
RECONFIGURING = 10226  # "stream reconfiguration already in progress": a scale not done yet
SETTLE_S = 60.0  # how long a scaled or moved stream may take to have every replica current


async def provision(
    broker: Broker,
    topology: Topology,
    *,
    settle_s: float = SETTLE_S,
    patience_s: float | None = None,
    keep: bool = False,
) -> Provisioning:
    """Bring every stream and bucket to its spec; returns what happened to each (a mapping of
    name to :class:`Outcome`, with the replicas, placement and leader of each).

    ``replicas: auto`` is resolved on this server, and never scales a stream down. Streams
    whose replicas or placement changed are awaited (up to ``settle_s``) until every
    replica is current, so the report says where they are, not where they are going.
    While JetStream does not answer (a leader election, most nodes down) it waits, saying
    so each try: for ever (a service's start), or ``patience_s`` in all, then Unavailable.
    ``keep``: what exists keeps its limits, capacities and retention; only what is missing
    is made, and replicas and placement are applied (provisioning without a config).
    """
    loop = asyncio.get_running_loop()
    deadline = None if patience_s is None else loop.time() + patience_s

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - loop.time())

    # The meta leader first: while there is none, the probe below is refused outright.
    meta = "the meta leader (the list of streams)"
    await until_answered(lambda: stream_names(broker), waiting_for=meta, patience_s=left())
    may_shrink = topology.replicas != AUTO
    replicas = await until_answered(
        lambda: resolve_replicas(broker, topology.replicas or 1),
        waiting_for="the replicas: auto probe",
        patience_s=left(),
    )
    if topology.replicas == AUTO:
        topology = topology.with_replicas(replicas)  # type: ignore[arg-type]
    js = broker.js
    kept = _not_to_update(broker)
    changes: list[tuple[str, str, Change]] = []
    with translated():  # a ProvisionError passes through; anything else is a BrokerError
        for stream in topology.streams:
            ours = stream.name not in kept
            ensure = functools.partial(
                ensure_stream, js, stream, may_shrink, may_update=ours, keep=keep
            )
            change = await _patiently(stream, ensure, left())
            changes.append((stream.name, stream.name, change))
        for bucket in topology.buckets:
            ensure = functools.partial(ensure_bucket, js, bucket, may_shrink, keep=keep)
            change = await _patiently(bucket, ensure, left())
            changes.append((bucket.name, bucket.stream, change))
        for store in topology.objects:
            ensure = functools.partial(ensure_objects, js, store, may_shrink, keep=keep)
            change = await _patiently(store, ensure, left())
            changes.append((store.name, store.stream, change))
    # Replication catches up in the background: wait for every stream at once.
    details = await asyncio.gather(
        *(wait_settled(js, name, stream, change, settle_s) for name, stream, change in changes)
    )
    for item in details:
        log.debug("provisioned", **item.fields())
    return Provisioning(details, replicas=replicas)


async def _patiently(
    spec: StreamSpec | BucketSpec | ObjectStoreSpec,
    ensure: Callable[[], Awaitable[Change]],
    patience_s: float | None,
) -> Change:
    """``await ensure()``, again while JetStream does not answer (for ever, or
    ``patience_s``) or cannot place the spec yet (see :func:`_placed`)."""
    placed = functools.partial(_placed, spec, ensure)
    return await until_answered(placed, waiting_for=spec.name, patience_s=patience_s)


async def _placed(
    spec: StreamSpec | BucketSpec | ObjectStoreSpec, ensure: Callable[[], Awaitable[Change]]
) -> Change:
    """``await ensure()``, again while it finds too few peers for the spec's replicas (a peer
    that has just started is "offline" for a moment) for up to :data:`PEERS_PATIENCE_S`, or
    while the stream is still scaling from an earlier run for up to :data:`PATIENCE_S`; then
    a ProvisionError that says why. No answer at all is the caller's to wait for."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        try:
            return await ensure()
        except nats.js.errors.APIError as exc:
            if unanswered(exc):
                raise
            waited_s = loop.time() - started
            if not (
                (exc.err_code == NO_SUITABLE_PEERS and waited_s < PEERS_PATIENCE_S)
                or (exc.err_code == RECONFIGURING and waited_s < PATIENCE_S)
            ):
                raise _provision_error(spec.name, exc, spec.replicas, spec.placement_tags) from exc
            log.info("cannot place it yet; asking again", name=spec.name, why=exc.description)
        await asyncio.sleep(1.0)


def _not_to_update(broker: Broker) -> frozenset[str]:
    """Streams these credentials may not update: the coordinator's permissions keep it from
    the history streams' limits (a smaller limit is a purge by another name)."""
    if broker.auth.role != "coordinator":
        return frozenset()
    return frozenset(broker.names.history_streams)


def _provision_error(
    name: str | None, exc: nats.js.errors.APIError, replicas: int, tags: tuple[str, ...]
) -> ProvisionError:
    broker_error = translate(exc)
    code = broker_error.err_code if isinstance(broker_error, JetStreamError) else None
    if code == NOT_CLUSTERED:
        return ProvisionError(
            f"cannot provision {name} with {replicas} replicas: this server is not part of a"
            f" JetStream cluster; use --replicas 1 or auto (err_code={code})"
        )
    if code == NO_SUITABLE_PEERS:
        servers = f"servers tagged {', '.join(tags)}" if tags else "servers"
        return ProvisionError(
            f"cannot provision {name} with {replicas} replicas: it needs {replicas} {servers}"
            " up, and the cluster has fewer (fewer nodes, or nodes down)"
            f" ({exc.description}; err_code={code})"
        )
    return ProvisionError(f"cannot provision {name}: {exc.description} (err_code={code})")


class Provisioner:
    """Provisions ``topology`` again when something of it went missing (a stream deleted by
    hand, a store lost): at most once per ``min_interval_s``, however many ask at once.

    It first asks the meta leader which streams exist, one cheap request: during a leader
    election (everything exists, nothing answers writes) it stops there, quietly.
    """

    def __init__(self, broker: Broker, topology: Topology, *, min_interval_s: float = 5.0):
        self._broker = broker
        self._topology = topology
        self._min_interval_s = min_interval_s
        self._last = -min_interval_s
        self._running: asyncio.Task[None] | None = None

    async def ensure(self, why: str) -> None:
        """Bring back what is missing (``why`` says what made us look); says loudly what
        was made again, and nothing when all was there (a timeout, a leader election)."""
        loop = asyncio.get_running_loop()
        if self._running is None or (
            self._running.done() and loop.time() - self._last >= self._min_interval_s
        ):
            self._last = loop.time()
            self._running = asyncio.create_task(self._provision(why))
        await asyncio.shield(self._running)

    async def _provision(self, why: str) -> None:
        topology = self._topology
        wanted = {s.name for s in topology.streams} | {b.stream for b in topology.buckets}
        try:
            missing = wanted - set(await stream_names(self._broker))
        except BrokerError as exc:
            log.debug("cannot list the streams now", why=why, error=str(exc))
            return
        if not missing:
            return
        try:
            outcomes = await provision(self._broker, topology, patience_s=PATIENCE_S)
        except Exception as exc:
            log.warning("could not check the streams and buckets", why=why, error=str(exc))
            return
        created = sorted(name for name, outcome in outcomes.items() if outcome is Outcome.CREATED)
        if created:
            log.error(
                "streams or buckets were missing; provisioned again", created=created, why=why
            )


async def wait_provisioned(broker: Broker, *, streams: list[str], buckets: list[str]) -> None:
    """Until every stream and bucket named exists, saying once per try which is missing.

    An agent that starts before the coordinator has provisioned a fresh server waits here
    (1, 2, 4 … s, capped at 30 s, jittered) instead of exiting; so does one that starts
    while JetStream cannot say which streams exist (a leader election, most nodes down).
    """
    tries = 0
    kv_streams = [f"KV_{b}" for b in buckets]
    while missing := await until_answered(
        lambda: _missing(broker, streams, kv_streams), waiting_for="the list of streams"
    ):
        wait_s = backoff_s(tries)
        tries += 1
        log.warning(
            "waiting for the streams and buckets: start the coordinator or run `reach provision`",
            missing=missing,
            retry_in_s=round(wait_s, 1),
        )
        await asyncio.sleep(wait_s)
    if tries:
        log.info("streams and buckets found")


async def _missing(broker: Broker, streams: list[str], kv_streams: list[str]) -> list[str]:
    """Which are not there yet, from the stream names: stream info is not granted to agents
    (it lists every subject of a stream)."""
    existing = set(await stream_names(broker))
    return [s.removeprefix("KV_") for s in [*streams, *kv_streams] if s not in existing]
