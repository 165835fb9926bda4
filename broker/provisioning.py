"""Bringing a server to the topology: idempotent provisioning, re-provisioning what went
missing, and waiting until someone else (the coordinator) has provisioned.

``provision()`` creates what is missing and applies changed limits to what exists, so
running it again never fails. A change the server cannot apply in place (a different
retention policy, say) is a :class:`ProvisionError` that names the stream and the field.
"""

from __future__ import annotations

import asyncio
import random

import nats.errors
import nats.js
import structlog
from nats.js import api

from agentreach.broker.connection import Broker
from agentreach.broker.errors import (
    JetStreamError,
    ProvisionError,
    translate,
    translated,
)
from agentreach.broker.topology import BucketSpec, Outcome, Topology

log = structlog.get_logger("broker.provisioning")

WAIT_FIRST_S = 1.0
WAIT_CAP_S = 30.0


async def provision(broker: Broker, topology: Topology) -> dict[str, Outcome]:
    """Bring every stream and bucket to its spec; returns what happened to each."""
    js = broker.js
    outcomes: dict[str, Outcome] = {}
    with translated():  # a ProvisionError passes through; anything else is a BrokerError
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
    created = existing is None
    if existing is None:
        try:
            await js.create_key_value(bucket.config())
        except nats.js.errors.APIError as exc:
            raise _provision_error(bucket.name, exc) from exc
        existing = await _existing(js, f"KV_{bucket.name}")
        assert existing is not None
    wanted = api.StreamConfig.from_response(existing.as_dict())
    wanted.max_msgs_per_subject = bucket.history
    wanted.max_age = bucket.ttl_s
    wanted.description = bucket.description or None
    # A writer of its own key could wipe the whole bucket with a roll-up header: no roll-ups
    # (Agent-Reach deletes keys, it never purges them).
    wanted.allow_rollup_hdrs, wanted.deny_purge = False, True
    outcome = await _update_if_changed(js, existing, wanted, quiet=created)
    return Outcome.CREATED if created else outcome


_MANAGED = (
    "subjects",
    "retention",
    "max_age",
    "duplicate_window",
    "max_msgs_per_subject",
    "discard",
    "discard_new_per_subject",
    "deny_delete",
    "deny_purge",
    "allow_rollup_hdrs",
    "description",
)
_IMMUTABLE = ("retention", "storage")


async def _update_if_changed(
    js: nats.js.JetStreamContext,
    existing: api.StreamConfig,
    wanted: api.StreamConfig,
    *,
    quiet: bool = False,
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
    if not quiet:
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


class Provisioner:
    """Provisions ``topology`` again when something of it went missing (a stream deleted by
    hand, a store lost): at most once per ``min_interval_s``, however many ask at once."""

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
        try:
            outcomes = await provision(self._broker, self._topology)
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
    (1, 2, 4 … s, capped at 30 s, jittered) instead of exiting.
    """
    tries = 0
    while missing := await _missing(broker, streams, [f"KV_{b}" for b in buckets]):
        wait_s = min(WAIT_CAP_S, WAIT_FIRST_S * 2**tries) * random.uniform(0.8, 1.2)
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
    missing = []
    for stream in [*streams, *kv_streams]:
        try:
            await broker.js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            missing.append(stream.removeprefix("KV_"))
        except nats.errors.Error as exc:
            raise translate(exc, subject=stream) from exc
    return missing
