"""Bounds on what a party can make the server keep: value sizes on the buckets whose
records are small by design, byte limits that refuse new writes on the streams that carry
work, and provisioning that never lowers a limit under what a stream holds."""

from __future__ import annotations

import pytest

from agentreach.broker import JetStreamError, StreamFull, Topology, provision
from agentreach.broker.claim_check import DEFAULT_THRESHOLD
from agentreach.broker.limits import StorageLimits
from agentreach.envelopes import Heartbeat

MESSAGE_TOO_LARGE = 10054  # "message size exceeds maximum allowed"


async def test_a_heartbeat_above_its_bucket_size_is_refused(broker):
    """A 900 KB heartbeat is refused with a clear error; a real one is stored."""
    heartbeats = await broker.bucket(broker.names.heartbeats_bucket, Heartbeat)
    beat = Heartbeat(agent_id="a-1", epoch=1, seq=1, interval_s=15.0)
    await heartbeats.put("a-1", beat)
    with pytest.raises(JetStreamError, match="maximum") as refused:
        await broker.publish(f"$KV.{broker.names.heartbeats_bucket}.a-1", b"x" * 900_000)
    assert refused.value.err_code == MESSAGE_TOO_LARGE
    assert (await heartbeats.get("a-1")).value == beat  # the real one is still there


async def test_an_execution_record_holds_a_result_up_to_the_threshold(broker):
    """A record with a result at the claim-check threshold is stored; 900 KB is refused."""
    subject = f"$KV.{broker.names.executions_bucket}.caller.m-1.agent-1"
    await broker.publish(subject, b'{"result": "' + b"r" * DEFAULT_THRESHOLD + b'"}')
    with pytest.raises(JetStreamError, match="maximum"):
        await broker.publish(subject.replace("m-1", "m-2"), b"r" * 900_000)


@pytest.mark.parametrize("bucket", ["agents_bucket", "liveness_bucket", "breakers_bucket"])
async def test_small_buckets_refuse_large_values(broker, bucket):
    """Cards, liveness and breakers take no megabyte values either."""
    name = getattr(broker.names, bucket)
    with pytest.raises(JetStreamError, match="maximum"):
        await broker.publish(f"$KV.{name}.some-key", b"v" * 900_000)


async def test_a_full_dead_letter_stream_refuses_instead_of_dropping(broker):
    """With its byte limit reached the DLQ refuses a new letter (the writer is told, and
    keeps the message it could not dead-letter); the letters it holds stay."""
    limits = StorageLimits(dead_letters_bytes=2_000)
    await provision(broker, Topology.default(broker.names, limits=limits))
    subject = broker.names.dlq("expired", "t")
    await broker.publish(subject, b"a" * 600, headers={"Nats-Msg-Id": "l-1"})
    with pytest.raises(StreamFull, match="maximum bytes") as refused:
        for i in range(2, 6):
            await broker.publish(subject, b"a" * 600, headers={"Nats-Msg-Id": f"l-{i}"})
    # Told apart from one subject's limit (err_code 10077 too), and the stream named.
    assert f"the stream of {subject!r} is full" in str(refused.value)
    info = await broker.js.stream_info(broker.names.dlq_stream)
    assert info.config.discard == "new" and info.state.messages >= 1
    first = await broker.js.get_msg(broker.names.dlq_stream, seq=1)
    assert first.data == b"a" * 600  # the oldest letter was not dropped to make room


async def test_a_full_event_stream_drops_its_oldest_events_and_takes_new_ones(broker):
    """Events are history: with `events_bytes` reached a new event is stored and the
    oldest goes (a flood by one party does not refuse the coordinator's own events)."""
    limits = StorageLimits(events_bytes=3_000)
    await provision(broker, Topology.default(broker.names, limits=limits))
    stream = broker.names.events_stream
    for i in range(10):
        subject = broker.names.event("progress", "t", f"m-{i}", f"m-{i}", "a-1")
        await broker.publish(subject, b"e" * 600, headers={"Nats-Msg-Id": f"e-{i}"})
    info = await broker.js.stream_info(stream)
    assert (info.config.max_bytes, info.config.discard) == (3_000, "old")
    assert info.state.bytes <= 3_000 and info.state.last_seq == 10 and info.state.first_seq > 1


async def test_provisioning_never_lowers_a_limit_under_what_a_stream_holds(broker):
    """A byte limit below what the stream holds is left as it was (the server would drop
    the oldest messages to fit it); a larger one is applied."""
    stream = broker.names.dlq_stream
    for i in range(5):
        await broker.publish(
            broker.names.dlq("expired", "t"), b"b" * 1_000, headers={"Nats-Msg-Id": f"k-{i}"}
        )
    before = (await broker.js.stream_info(stream)).config.max_bytes
    done = await provision(
        broker, Topology.default(broker.names, limits=StorageLimits(dead_letters_bytes=1_000))
    )
    info = await broker.js.stream_info(stream)
    assert info.config.max_bytes == before and info.state.messages == 5
    # `reach provision` said "unchanged", exit 0; the refusal was a log line alone (a trial).
    [dlq] = [p for p in done.details if p.name == stream]
    assert dlq.note.startswith("max_bytes 1000 not applied, unlimited kept: the stream holds")
    assert dlq.note in dlq.describe()
    await provision(
        broker, Topology.default(broker.names, limits=StorageLimits(dead_letters_bytes=10**6))
    )
    assert (await broker.js.stream_info(stream)).config.max_bytes == 10**6


async def test_the_limits_reach_the_server(broker):
    """Provisioning sets the value sizes and byte limits of the topology."""
    names, limits = broker.names, StorageLimits()
    heartbeats = await broker.js.stream_info(f"KV_{names.heartbeats_bucket}")
    records = await broker.js.stream_info(f"KV_{names.executions_bucket}")
    tasks = await broker.js.stream_info(names.tasks_stream)
    payloads = await broker.js.stream_info(f"OBJ_{names.payloads_bucket}")
    assert heartbeats.config.max_msg_size == limits.small_value_bytes
    assert records.config.max_msg_size == limits.record_bytes
    assert (tasks.config.max_bytes, tasks.config.discard) == (limits.tasks_bytes, "new")
    assert payloads.config.max_bytes == limits.payloads_bytes


async def test_settled_and_audit_records_are_bounded_and_refuse_past_their_limit(broker):
    """REACH_SETTLED and REACH_AUDIT had no byte limit (anyone could have the server fill
    them with its answers, a security re-test found): bounded, a write past it is refused,
    as REACH_DLQ's is, not made room for by dropping a record."""
    limits = StorageLimits(settled_bytes=3_000, audit_bytes=4_000)
    await provision(broker, Topology.default(broker.names, limits=limits))
    names = broker.names
    for stream, limit in ((names.settled_stream, 3_000), (names.audit_stream, 4_000)):
        info = await broker.js.stream_info(stream)
        assert (info.config.max_bytes, info.config.discard) == (limit, "new")
    subject = f"{names.prefix}.settled.resolved.t.m-1.m-1.op"
    with pytest.raises(StreamFull):
        for i in range(10):
            await broker.publish(subject, b"r" * 600, headers={"Nats-Msg-Id": f"r-{i}"})
    assert (await broker.js.stream_info(names.settled_stream)).state.messages < 10


async def test_the_execution_records_together_are_bounded(broker):
    """An agent may write any key of its own in `reach_executions`: one wrote 2.3 GB of
    records in 20 s, and no `limits:` key bounded them (security re-test). `records_bytes`
    does; past it a new record is refused, and the bucket shows in the fill gauges."""
    await provision(
        broker, Topology.default(broker.names, limits=StorageLimits(records_bytes=4_000))
    )
    names = broker.names
    stream = f"KV_{names.executions_bucket}"
    info = await broker.js.stream_info(stream)
    assert (info.config.max_bytes, info.config.discard) == (4_000, "new")
    assert stream in names.limited_streams
    with pytest.raises(StreamFull):
        for i in range(10):
            await broker.publish(f"$KV.{names.executions_bucket}.c.m-{i}.mallory", b"r" * 600)
    assert (await broker.js.stream_info(stream)).state.messages < 10


async def test_the_workflow_stream_is_bounded_and_refuses_past_its_limit(broker):
    """REACH_WORKFLOWS had no byte limit: a caller's signals to any instance id are stored
    until the engine looks at them (about 15 s), at whatever rate it sends. `workflows_bytes`
    bounds it; a signal past it is refused, to its sender."""
    limits = StorageLimits(workflows_bytes=3_000)
    await provision(broker, Topology.default(broker.names, limits=limits))
    names = broker.names
    info = await broker.js.stream_info(names.workflows_stream)
    assert (info.config.max_bytes, info.config.discard) == (3_000, "new")
    assert names.workflows_stream in names.limited_streams
    with pytest.raises(StreamFull):
        for i in range(10):
            signal = f"{names.workflow_signal(f'no-such-{i}', 'go')}.mallory"
            await broker.publish(signal, b"s" * 600)
    assert (await broker.js.stream_info(names.workflows_stream)).state.messages < 10
