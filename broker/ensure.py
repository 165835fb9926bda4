"""Bringing one stream, bucket or object store to its spec: created when missing, else
what differs of what Agent-Reach manages on it is applied in place (see
:mod:`~agentreach.broker.provisioning`)."""

from __future__ import annotations

import nats.errors
import nats.js
from nats.js import api

from agentreach.broker.errors import ProvisionError
from agentreach.broker.provisioned import Change
from agentreach.broker.topology import BucketSpec, ObjectStoreSpec, Outcome, StreamSpec
from agentreach.logs import get_logger

log = get_logger("broker.provisioning")


async def _existing(js: nats.js.JetStreamContext, stream: str) -> api.StreamInfo | None:
    try:
        return await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return None


async def ensure_stream(
    js: nats.js.JetStreamContext,
    spec: StreamSpec,
    may_shrink: bool,
    *,
    may_update: bool = True,
    keep: bool = False,
) -> Change:
    wanted = spec.config()
    existing = await _existing(js, spec.name)
    if existing is None:
        await js.add_stream(wanted)
        return Change(Outcome.CREATED)
    return await _update_if_changed(
        js, existing, wanted, may_shrink, may_update=may_update, keep=keep
    )


async def ensure_bucket(
    js: nats.js.JetStreamContext, bucket: BucketSpec, may_shrink: bool, *, keep: bool = False
) -> Change:
    existing = await _existing(js, bucket.stream)
    if existing is None:
        await js.add_stream(bucket.config())
        return Change(Outcome.CREATED)
    # Only what we manage changes; the rest of a bucket's stream stays as it was made.
    spec = bucket.config()
    wanted = api.StreamConfig.from_response(existing.config.as_dict())
    wanted.max_msgs_per_subject = bucket.history
    wanted.max_msg_size = spec.max_msg_size
    wanted.max_bytes = spec.max_bytes
    wanted.max_age = bucket.ttl_s
    wanted.description = bucket.description or None
    wanted.allow_rollup_hdrs, wanted.deny_purge = spec.allow_rollup_hdrs, spec.deny_purge
    wanted.num_replicas = bucket.replicas
    wanted.placement = spec.placement
    return await _update_if_changed(js, existing, wanted, may_shrink, keep=keep)


async def ensure_objects(
    js: nats.js.JetStreamContext, store: ObjectStoreSpec, may_shrink: bool, *, keep: bool = False
) -> Change:
    existing = await _existing(js, store.stream)
    if existing is None:
        await js.create_object_store(store.name, config=store.config())
        return Change(Outcome.CREATED)
    wanted = api.StreamConfig.from_response(existing.config.as_dict())
    wanted.max_age = store.ttl_s
    wanted.max_bytes = store.max_bytes
    wanted.description = store.description or None
    wanted.num_replicas = store.replicas
    wanted.placement = store.config().placement
    return await _update_if_changed(js, existing, wanted, may_shrink, keep=keep)


_MANAGED = (
    "subjects",
    "retention",
    "max_age",
    "duplicate_window",
    "max_msgs_per_subject",
    "max_bytes",
    "max_msg_size",
    "discard",
    "discard_new_per_subject",
    "deny_delete",
    "deny_purge",
    "allow_rollup_hdrs",
    "description",
    "num_replicas",
    "placement",
)
_IMMUTABLE = ("retention", "storage")
# What a coordinator's config sets (limits, queue capacities, retention days): kept as it
# is by a provisioning without a config.
_LIMITS = ("max_bytes", "max_msgs_per_subject", "max_msg_size", "max_msgs", "max_age")


async def _update_if_changed(
    js: nats.js.JetStreamContext,
    info: api.StreamInfo,
    wanted: api.StreamConfig,
    may_shrink: bool,
    *,
    may_update: bool = True,
    keep: bool = False,
) -> Change:
    """Apply to the stream what differs from ``wanted`` of what we manage; with ``keep``,
    not its limits (``reach provision`` without a config: the limits, capacities and
    retention a coordinator's config set stand)."""
    existing = info.config
    note = ""
    # A byte limit below what the stream holds would make the server drop its oldest.
    if 0 < (wanted.max_bytes or 0) < (held := info.state.bytes or 0):
        kept = _shown(existing, "max_bytes")
        note = (
            f"max_bytes {wanted.max_bytes} not applied, {kept} kept: the stream holds {held}"
            " bytes (the config's limits section: raise it above that, or let the stream drain)"
        )
        log.warning("stream holds more than max_bytes: limit kept", stream=wanted.name,
                    held=held, asked=wanted.max_bytes, kept=kept)  # fmt: skip
        wanted.max_bytes = existing.max_bytes
    changed = [f for f in _MANAGED if _norm(existing, f) != _norm(wanted, f)]
    before = existing.num_replicas or 1
    if "num_replicas" in changed and (wanted.num_replicas or 1) < before and not may_shrink:
        changed.remove("num_replicas")  # auto never shrinks: a node may just be down
        log.info("keeping the replicas (replicas: auto never scales down)", stream=wanted.name)
    if "placement" in changed and not _norm(wanted, "placement"):
        # No profile asked for: the placement is left as it is, so that a process started
        # without --durable never moves the work streams off the servers that sync always.
        changed.remove("placement")
    if keep and (kept := [f for f in changed if f in _LIMITS]):
        log.info("limits kept as they are (no config given)", stream=wanted.name, fields=kept)
        changed = [f for f in changed if f not in _LIMITS]
    if not changed:
        return Change(Outcome.UNCHANGED, note=note)
    if not may_update:
        log.warning(
            "stream differs from the topology, and these credentials may not update it:"
            " run `reach provision` as an operator",
            stream=wanted.name,
            fields=changed,
        )
        return Change(Outcome.UNCHANGED, note=note)
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
    await js.update_stream(merged)
    # Before and after: a limit lifted by a config without it is seen, not just named.
    was = {f: [_shown(existing, f), _shown(wanted, f)] for f in changed if f in _LIMITS}
    say = log.warning if was else log.info
    say("stream updated", stream=wanted.name, fields=changed, **was)
    scaled = before if "num_replicas" in changed else None
    return Change(Outcome.UPDATED, scaled, note=note)


def _norm(config: api.StreamConfig, field: str) -> object:
    value = getattr(config, field)
    if field == "num_replicas":
        return value or 1
    if field == "placement":
        return tuple(sorted(value.tags or ())) if value is not None else ()
    if isinstance(value, list):
        return sorted(value)
    if value in (None, 0, 0.0, "", -1):
        return None
    return value


def _shown(config: api.StreamConfig, field: str) -> object:
    value = getattr(config, field)
    return "unlimited" if value in (None, 0, -1) else value
