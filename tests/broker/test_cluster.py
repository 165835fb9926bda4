"""Replication on a real 3-node JetStream cluster (three nats-server processes on loopback):
auto replicas, scaling in place, the durable profile's placement, and writes and watches that
ride out a kill -9 of a stream's leader."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentreach.broker import (
    Broker,
    BrokerConfig,
    EmbeddedCluster,
    Outcome,
    ProvisionError,
    Topology,
    provision,
)
from agentreach.broker.embedded import PID_FILE
from agentreach.broker.errors import EmbeddedServerError
from agentreach.broker.watch import BucketWatch
from agentreach.envelopes import Heartbeat
from tests.scrape import http_get
from tests.support import stopped

ELECTION_BOUND_S = 15.0  # elections took 3.5-8.6 s in the probes; a loaded CI machine is slower


def beat(agent_id: str) -> Heartbeat:
    return Heartbeat(agent_id=agent_id, epoch=1, seq=1, interval_s=15.0)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmbeddedCluster]:
    async with EmbeddedCluster(3, store_dir=tmp_path / "cluster") as running:
        yield running


async def test_auto_is_three_replicas_on_a_cluster(cluster):
    """`replicas: auto` makes every stream and bucket R3 on three peers, with a leader and two
    current replicas each, and leaves no probe stream behind."""
    async with Broker(cluster.url) as broker:
        report = await provision(broker, Topology.default(broker.names))
        streams = {info.config.name for info in await broker.js.streams_info()}
    assert report.replicas == 3
    assert {d.replicas for d in report.details} == {3}
    assert all(d.leader and len(d.peers) == 2 and d.current for d in report.details)
    assert not [s for s in streams if "PROBE" in s]


async def test_explicit_replicas_on_a_single_server_is_refused_by_name(broker):
    """On one server, auto is 1; an explicit 3 is a ProvisionError that says what to use."""
    report = await provision(broker, Topology.default(broker.names))
    assert report.replicas == 1
    with pytest.raises(ProvisionError, match="not part of a JetStream cluster; use --replicas 1"):
        await provision(broker, Topology.default(broker.names, replicas=3))


async def test_rising_replicas_scale_streams_and_buckets_in_place(cluster):
    """R1 streams and buckets become R3 in place, keeping what they hold; auto never scales
    back down, an explicit 1 does."""
    async with Broker(cluster.url) as broker:
        names = broker.names
        await provision(broker, Topology.default(names, replicas=1))
        await broker.publish(names.task("kept"), b"{}", headers={"Nats-Msg-Id": "kept-1"})
        beats = await broker.bucket(names.heartbeats_bucket, Heartbeat)
        await beats.put("agent-1", beat("agent-1"))
        scaled = await provision(broker, Topology.default(names))
        tasks = next(d for d in scaled.details if d.name == names.tasks_stream)
        kept = (await broker.js.stream_info(names.tasks_stream)).state.messages
        stored_beat = await beats.get("agent-1")
        shrunk_by_auto = await provision(broker, Topology.default(names))
        shrunk = await provision(broker, Topology.default(names, replicas=1))
    assert set(scaled.values()) == {Outcome.UPDATED}
    assert (tasks.replicas_before, tasks.replicas, len(tasks.peers)) == (1, 3, 2)
    assert "R1→R3" in tasks.describe()
    assert kept == 1 and stored_beat is not None and stored_beat.value.epoch == 1
    assert set(shrunk_by_auto.values()) == {Outcome.UNCHANGED}
    assert {d.replicas for d in shrunk.details} == {1}


async def test_the_durable_profile_places_work_on_sync_always_servers(tmp_path):
    """With `durable`, tasks, dispatch and DLQ are placed on the servers tagged sync:always
    (the others anywhere), and provisioning without the profile does not move them back; with
    too few such servers for R3 the error names the tag."""
    syncs = ["always", "always", "2m"]
    async with (
        EmbeddedCluster(3, store_dir=tmp_path / "c", sync_interval=syncs) as cluster,
        Broker(cluster.url) as broker,
    ):
        names, profile = broker.names, BrokerConfig(durable=True)
        topology = Topology.default(names, replicas=1, work_tags=profile.work_tags)
        report = await provision(broker, topology)
        without_profile = await provision(broker, Topology.default(names, replicas=1))
        with pytest.raises(ProvisionError, match="needs 3 servers tagged sync:always"):
            await provision(broker, Topology.default(names, replicas=3, work_tags=("sync:always",)))
    placed = {d.name: (d.tags, d.leader) for d in report.details}
    work = {names.tasks_stream, names.dlq_stream, *names.dispatch_streams.values()}
    for stream in work:
        tags, leader = placed[stream]
        assert tags == ("sync:always",) and leader in ("n1", "n2"), (stream, placed[stream])
    assert placed[names.events_stream][0] == ()
    # A process started without the profile leaves the placement alone.
    assert set(without_profile.values()) == {Outcome.UNCHANGED}


async def test_writes_and_watches_ride_out_a_kill_of_the_leader(cluster):
    """Kill -9 the node leading REACH_TASKS and a bucket: a publish made during the election
    is stored once when the new leader takes it, KV writes go on, and a watch started before
    the kill sees a write made after it, within seconds of the election."""
    async with Broker(cluster.url, name="writer") as broker:
        names = broker.names
        await provision(broker, Topology.default(names))
        bucket = names.heartbeats_bucket
        victim = await cluster.leader_of(names.tasks_stream)
        assert victim is not None
        # The bucket's stream led by the same node, so the watch loses its leader too.
        await _lead_from(broker, cluster, f"KV_{bucket}", victim)
        beats = await broker.bucket(bucket, Heartbeat)
        async with BucketWatch(await broker.kv(bucket)) as watch:
            changes = aiter(watch)
            await beats.put("before", beat("before"))
            assert (await anext(changes)).key == "before"
            killed = time.monotonic()
            await cluster.kill(victim)
            ack = await broker.publish(
                names.task("during"), b"{}", headers={"Nats-Msg-Id": "during-1"}
            )
            published_s = time.monotonic() - killed
            await beats.put("after", beat("after"))
            async with asyncio.timeout(ELECTION_BOUND_S):
                while (change := await anext(changes)).key != "after":
                    pass
            seen_s = time.monotonic() - killed
        stored = (await broker.js.stream_info(names.tasks_stream)).state.messages
    assert not ack.duplicate and stored == 1
    assert published_s < ELECTION_BOUND_S
    assert change.value is not None and seen_s < ELECTION_BOUND_S
    print(f"publish stored {published_s:.2f} s after the kill, watch saw a write {seen_s:.2f} s")


async def _lead_from(broker: Broker, cluster: EmbeddedCluster, stream: str, node: int) -> None:
    """Step the stream's leader down until ``node`` leads it."""
    async with asyncio.timeout(30):
        while (leader := await cluster.leader_of(stream)) != node:
            if leader is not None:
                await broker.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", timeout=5)
            await cluster.wait_leader(stream, not_on=leader)


async def test_the_report_tells_a_dead_replica_from_one_catching_up(cluster):
    """After a kill -9 of the node leading REACH_TASKS, `reach provision`'s report names that
    node as not current, offline or cut off, not as catching up (which it would be for ever);
    `auto` still means the three replicas the streams have, not one."""
    async with Broker(cluster.url, name="operator") as broker:
        names = broker.names
        await provision(broker, Topology.default(names))
        victim = await cluster.leader_of(names.tasks_stream)
        assert victim is not None
        await cluster.kill(victim)
        await cluster.wait_leader(names.tasks_stream, not_on=victim)
        report = await provision(broker, Topology.default(names))
    assert report.replicas == 3
    [tasks] = [d for d in report.details if d.name == names.tasks_stream]
    dead = cluster.node_name(victim)
    assert tasks.away == (dead,) and not tasks.lagging
    assert tasks.describe().endswith(f"({dead} not current: offline or cut off?)")


# nats-py drops, unclosed, the stream of a reconnect attempt that timed out on the frozen node
# (its socket accepts; nothing answers): a ResourceWarning when it is collected, not ours.
@pytest.mark.filterwarnings(
    "ignore:unclosed <StreamWriter:ResourceWarning",
    "ignore::pytest.PytestUnraisableExceptionWarning",
)
async def test_a_client_leaves_a_frozen_node_for_another(cluster):
    """A node that stops answering without closing its sockets (SIGSTOP: a hung host, a
    partition) is left for another seed after a few missed pings, well within 30 s (it took
    40 s with nats-py pinging every 10 s and giving up after 3 missed)."""
    async with Broker(cluster.url, name="frozen-probe") as broker:
        frozen = broker.server
        node = next(n for n in range(cluster.size) if cluster.url_of(n).endswith(frozen))
        pid = int((cluster.store_dir / cluster.node_name(node) / PID_FILE).read_text())
        await stopped(pid)
        try:
            async with asyncio.timeout(30):
                while broker.server == frozen or not broker.connected:  # noqa: ASYNC110
                    await asyncio.sleep(0.2)  # polling: the reconnect has no event to await
        finally:
            os.kill(pid, signal.SIGCONT)
        assert broker.server != frozen


def free_runs(count: int, length: int) -> list[int]:
    """``count`` starts of ``length`` consecutive loopback ports nobody listens on, apart."""
    starts: list[int] = []
    for _ in range(1000):
        start = random.randrange(20_000, 30_000)
        wanted = range(start, start + length)
        if any(abs(start - other) < length for other in starts) or not all(map(_free, wanted)):
            continue
        starts.append(start)
        if len(starts) == count:
            return starts
    raise AssertionError("no free ports found")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_route_and_monitoring_ports_can_be_given_apart_from_the_client_ports(tmp_path):
    """`reach up --cluster 3 --port P` put routes at P+2000 and monitoring at P+4000, out of a
    port window an operator was given (an outside trial); `--cluster-ports ROUTE,MONITORING`
    sets them, each node taking the next, and ranges that overlap are refused by name."""
    client, routes, http = free_runs(3, 3)
    cluster = EmbeddedCluster(
        3, store_dir=tmp_path / "c", client_port=client, route_port=routes, http_port=http
    )
    async with cluster:
        assert cluster.urls == [f"nats://127.0.0.1:{client + i}" for i in range(3)]
        for node in range(3):
            assert cluster.monitoring_url(node) == f"http://127.0.0.1:{http + node}"
            status, body = await http_get(f"{cluster.monitoring_url(node)}/varz")
            assert status == 200 and f": {routes + node}," in body  # its cluster port
    with pytest.raises(EmbeddedServerError, match="client ports from 4222 and route ports"):
        EmbeddedCluster(3, client_port=4222, route_port=4224)
    with pytest.raises(EmbeddedServerError, match="need a first client port"):
        EmbeddedCluster(3, route_port=6222)
