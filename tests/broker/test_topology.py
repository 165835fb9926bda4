"""Provisioning every stream and bucket from one description, idempotently."""

from __future__ import annotations

import dataclasses

import pytest

from agentreach.broker import Outcome, ProvisionError, Topology, provision


async def test_provision_creates_everything_then_changes_nothing(broker):
    """A second run reports every stream and bucket unchanged."""
    topology = Topology.default(broker.names)
    again = await provision(broker, topology)
    assert set(again.values()) == {Outcome.UNCHANGED}
    names = broker.names
    expected = {
        names.tasks_stream,
        names.events_stream,
        names.dlq_stream,
        names.settled_stream,
        *names.dispatch_streams.values(),
        names.agents_bucket,
        names.heartbeats_bucket,
        names.liveness_bucket,
        names.advisories_stream,
        names.executions_bucket,
        names.leases_bucket,
        names.breakers_bucket,
        names.quotas_bucket,
        names.manual_bucket,
        names.workflows_stream,
        names.workflows_bucket,
        names.audit_stream,
        names.payloads_bucket,
    }
    assert set(again) == expected
    info = await broker.js.stream_info(names.tasks_stream)
    assert info.config.subjects == [f"{names.prefix}.task.>"]
    assert info.config.retention == "workqueue"


async def test_each_agent_queue_is_capped_by_the_broker(broker):
    """A dispatch subject refuses the message past its priority's capacity (discard new)."""
    from agentreach.broker import SubjectFull

    capped = Topology.default(broker.names, queue_capacity={"P0": 2})
    await provision(broker, capped)
    subject = broker.names.dispatch("busy-agent", "P0")
    for _ in range(2):
        await broker.publish(subject, b"{}")
    with pytest.raises(SubjectFull):
        await broker.publish(subject, b"{}")
    await broker.publish(broker.names.dispatch("other-agent", "P0"), b"{}")  # per agent
    info = await broker.js.stream_info(broker.names.dispatch_stream("P0"))
    assert info.config.max_msgs_per_subject == 2


async def test_changed_limits_are_applied(broker):
    """A new max_age on a stream and a new history on a bucket reach the server."""
    base = Topology.default(broker.names)
    streams = tuple(
        dataclasses.replace(s, max_age_s=3600.0) if s.name == broker.names.events_stream else s
        for s in base.streams
    )
    buckets = tuple(
        dataclasses.replace(b, history=3) if b.name == broker.names.agents_bucket else b
        for b in base.buckets
    )
    outcomes = await provision(broker, Topology(streams=streams, buckets=buckets))
    assert outcomes[broker.names.events_stream] is Outcome.UPDATED
    assert outcomes[broker.names.agents_bucket] is Outcome.UPDATED
    assert outcomes[broker.names.dlq_stream] is Outcome.UNCHANGED
    events = await broker.js.stream_info(broker.names.events_stream)
    agents = await broker.js.stream_info(f"KV_{broker.names.agents_bucket}")
    assert events.config.max_age == 3600.0
    assert agents.config.max_msgs_per_subject == 3


async def test_a_change_the_server_cannot_make_is_a_clear_error(broker):
    """Changing the retention of an existing stream names the stream and the field."""
    base = Topology.default(broker.names)
    streams = tuple(
        dataclasses.replace(s, retention="limits") if s.name == broker.names.tasks_stream else s
        for s in base.streams
    )
    with pytest.raises(ProvisionError) as caught:
        await provision(broker, Topology(streams=streams, buckets=base.buckets))
    assert f"stream {broker.names.tasks_stream}: retention" in str(caught.value)


async def test_uncapped_dispatch_streams_are_capped_in_place(broker):
    """Dispatch streams made before queue caps existed are updated, not refused."""
    base = Topology.default(broker.names)
    uncapped = tuple(
        dataclasses.replace(s, max_msgs_per_subject=-1, discard_new_per_subject=False)
        if s.name in broker.names.dispatch_streams.values()
        else s
        for s in base.streams
    )
    await provision(broker, Topology(streams=uncapped, buckets=base.buckets))
    outcomes = await provision(broker, Topology.default(broker.names, queue_capacity={"P0": 5}))
    assert outcomes[broker.names.dispatch_stream("P0")] == Outcome.UPDATED
    config = (await broker.js.stream_info(broker.names.dispatch_stream("P0"))).config
    assert (config.max_msgs_per_subject, config.discard_new_per_subject) == (5, True)


async def test_buckets_are_made_whole_in_one_step(broker):
    """A bucket's stream is created with what nats-py gives a bucket, no roll-ups and no purges
    (a writer of one key cannot wipe the bucket), and its replicas; it stays unchanged."""
    info = await broker.js.stream_info(f"KV_{broker.names.agents_bucket}")
    config = info.config
    assert config.subjects == [f"$KV.{broker.names.agents_bucket}.>"]
    assert config.deny_delete and config.deny_purge and not config.allow_rollup_hdrs
    assert config.allow_direct and config.max_msgs_per_subject == 1
    assert config.num_replicas == 1
    again = await provision(broker, Topology.default(broker.names))
    assert again[broker.names.agents_bucket] is Outcome.UNCHANGED
