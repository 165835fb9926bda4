"""A client on a server nobody provisioned, or that does not answer, gets the SDK's own
error, saying what to do."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from agentreach import Agent, NotProvisioned, NotStored, ReachClient, ReachError, TaskContext
from agentreach.broker import Broker, BrokerError, NoStreamError, Topology, provision
from agentreach.broker.embedded import PID_FILE
from tests.support import stopped


@pytest.mark.parametrize("call", ["invoke", "publish"])
async def test_a_task_on_an_unprovisioned_server_raises_not_provisioned(nats_url, call):
    """invoke and publish on a fresh server raise NotProvisioned (an InvokeError with the
    task's ids) that says to run `reach provision`; it was the broker's NoStreamError, which
    invoke's documented errors did not name (still one, for code that caught that)."""
    async with ReachClient(nats_url) as client:
        with pytest.raises(NotProvisioned) as caught:
            if call == "invoke":
                await client.invoke("summarize", {"text": "hi"}, message_id="unsent-1")
            else:
                await client.publish("summarize", {"text": "hi"}, message_id="unsent-1")
    error = caught.value
    assert isinstance(error, ReachError) and isinstance(error, NoStreamError)
    assert error.message_id == "unsent-1"
    assert "'summarize' was not sent" in str(error) and "reach provision" in str(error)


async def test_a_task_jetstream_does_not_take_in_time_raises_not_stored_with_its_id(
    nats_url, tmp_path
):
    """A server that does not answer for longer than the election budget (SIGSTOP here; a
    restart, an election, a cluster without its majority): NotStored with the task's ids,
    which it may have been stored under (was the broker's bare Unavailable)."""
    pid_file = tmp_path / "nats" / PID_FILE
    if not pid_file.exists():
        pytest.skip("stops the test's own nats-server (NATS_URL is set)")
    pid = int(pid_file.read_text())
    async with Broker(nats_url, election_budget_s=0.5, request_timeout=0.2) as broker:
        await provision(broker, Topology.default(broker.names))
        async with ReachClient(broker=broker) as client:
            await stopped(pid)
            try:
                with pytest.raises(NotStored) as caught:
                    await client.publish("summarize", {"text": "hi"}, message_id="unheard-1")
            finally:
                os.kill(pid, signal.SIGCONT)
    error = caught.value
    assert isinstance(error, BrokerError) and error.message_id == "unheard-1"
    assert "may not have been stored" in str(error) and "message_id='unheard-1'" in str(error)


async def test_invoke_waits_for_jetstream_as_long_as_its_ack_deadline(
    broker, coordinator, nats_url, tmp_path
):
    """A lost majority kept JetStream from answering for 14 s: invoke raised NotStored at the
    election budget (15 s), though its caller gave an agent 40 s to accept the task (a
    cluster trial). It sends the task again under its id for as long as its ack deadline,
    and the task runs once."""
    pid_file = tmp_path / "nats" / PID_FILE
    if not pid_file.exists():
        pytest.skip("stops the test's own nats-server (NATS_URL is set)")
    pid = int(pid_file.read_text())
    agent = Agent("patient-store", startup_delay=0)
    runs: list[int] = []

    @agent.handler("count")
    async def count(ctx: TaskContext, payload: dict) -> dict:
        runs.append(payload["n"])
        return payload

    async with (
        agent.running(broker=broker),
        Broker(nats_url, names=broker.names, election_budget_s=0.5, request_timeout=0.3) as own,
        ReachClient(broker=own) as client,
    ):
        await stopped(pid)
        loop = asyncio.get_running_loop()
        loop.call_later(2.0, os.kill, pid, signal.SIGCONT)  # the outage: 4 election budgets
        result = await client.invoke("count", {"n": 1}, ack_deadline_ms=20_000)
    assert result == {"n": 1} and runs == [1]
