"""Starting while the cluster cannot answer: with two nodes of three down there is no meta
leader, and every JetStream API request is refused. A service's start waits for a node to
come back, saying what it waits for; an operator's command fails with a line that says why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agentreach.broker import (
    Broker,
    BrokerError,
    ConsumerSpec,
    EmbeddedCluster,
    Topology,
    bind,
    provision,
    wait_provisioned,
)
from tests.cli.conftest import reach_command, run

WAITING = "waiting for JetStream: the cluster may be electing a leader"


async def test_a_start_waits_for_a_lost_majority_and_goes_on_when_a_node_is_back(tmp_path: Path):
    """Provisioning (replicas: auto), creating a consumer and looking for the streams all wait
    while two nodes of three are down, one warning per try naming what they wait for, and
    finish once one node is back; meanwhile a one-shot read says the cluster may be electing
    a leader or most of its nodes may be down, naming the stream."""
    async with EmbeddedCluster(3, store_dir=tmp_path / "cluster") as cluster:
        async with Broker(cluster.url) as first:
            await provision(first, Topology.default(first.names))
        await cluster.kill(0)
        await cluster.kill(1)
        async with asyncio.timeout(30):
            while await cluster.meta_leader() is not None:  # noqa: ASYNC110 - no event says so
                await asyncio.sleep(0.1)
        async with Broker(cluster.url_of(2)) as broker:
            names = broker.names
            spec = ConsumerSpec(
                stream=names.dispatch_stream("P1"),
                durable="starting-agent",
                filter_subjects=(names.dispatch("starting-agent", "P1"),),
            )
            with capture_logs() as logs:
                starts = [
                    asyncio.create_task(provision(broker, Topology.default(names))),
                    asyncio.create_task(bind(broker, spec)),
                    asyncio.create_task(
                        wait_provisioned(
                            broker, streams=[names.tasks_stream], buckets=[names.agents_bucket]
                        )
                    ),
                ]
                done, _ = await asyncio.wait(starts, timeout=4)
                assert not done, [task.exception() for task in done]
                with pytest.raises(BrokerError) as one_shot:
                    await broker.kv(names.agents_bucket)
                command = await run(
                    reach_command(), "agents", "--nats-url", cluster.url_of(2), timeout=30
                )
                await cluster.start(0)
                report, consumer, _ = await asyncio.wait_for(asyncio.gather(*starts), 90)
                await consumer.close()
    waited_for = {line.get("waiting_for") for line in logs if WAITING in line["event"]}
    assert {"the meta leader (the list of streams)", "the list of streams"} <= waited_for
    assert "consumer starting-agent of stream REACH_DISPATCH_P1" in waited_for
    assert report.replicas == 3
    for said in (str(one_shot.value), command.stderr):
        assert "KV_reach_agents" in said
        assert "may be electing a leader, or most of its nodes may be down" in said
    assert command.returncode == 1
