"""A client on a server nobody provisioned, or that does not answer, gets the SDK's own
error, saying what to do."""

from __future__ import annotations

import os
import signal

import pytest

from agentreach import NotProvisioned, NotStored, ReachClient, ReachError
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
