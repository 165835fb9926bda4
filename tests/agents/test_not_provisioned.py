"""A client on a server nobody provisioned gets the SDK's own error, saying what to run."""

from __future__ import annotations

import pytest

from agentreach import NotProvisioned, ReachClient, ReachError
from agentreach.broker import NoStreamError


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
