"""A caller whose backlog on a topic is full gets the SDK's own error, and nothing is sent."""

from __future__ import annotations

import pytest

from agentreach import BacklogFull, InvokeError, ReachClient
from agentreach.broker import SubjectFull, Topology, provision, read_stream
from agentreach.broker.topology import StorageLimits


async def test_a_task_past_the_callers_backlog_raises_backlog_full(broker):
    """Nothing takes the intake here (no coordinator): two tasks fill the caller's backlog on
    the topic, the third is refused at the server, as BacklogFull (was the broker's
    SubjectFull with the server's words), and is not stored."""
    names = broker.names
    await provision(broker, Topology.default(names, limits=StorageLimits(tasks_per_subject=2)))
    async with ReachClient(broker=broker) as client:
        for n in range(2):
            await client.publish("summarize", {"n": n})
        with pytest.raises(BacklogFull) as caught:
            await client.publish("summarize", {"n": 2}, message_id="one-too-many")
        with pytest.raises(BacklogFull):
            await client.invoke("summarize", {"n": 3})
        caller = client.caller
    error = caught.value
    assert isinstance(error, InvokeError) and isinstance(error, SubjectFull)
    assert error.message_id == "one-too-many"
    assert "'summarize' was not sent" in str(error) and caller in str(error)
    assert "tasks_per_subject" in str(error)
    stored = await read_stream(broker, names.tasks_stream, names.task("summarize", caller))
    assert len(stored) == 2
