"""What an instance's events say of it: ``workflow_started`` summarises its input, so a
caller that sends another request under an id it used for a workflow is refused, as with a
task, instead of being answered with the first run's result."""

from __future__ import annotations

from collections import Counter

import pytest

from agentreach.agents import ReachClient, Rejected
from agentreach.coordinator import workflow as wf
from agentreach.envelopes import new_id
from tests.e2e.routing_support import fast, serving, worker

FLOWS = {"one": wf.chain(wf.step("a", "work"))}


async def test_another_payload_under_a_workflow_s_id_is_refused_not_answered_from_the_first(
    broker, start_coordinator
):
    counts: Counter[str] = Counter()
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, worker("w-1", counts)),
        ReachClient(broker=broker) as client,
    ):
        instance = new_id()
        first = await client.invoke("one", {"order": 7}, message_id=instance)
        with pytest.raises(Rejected) as other:
            await client.invoke("one", {"order": 8}, message_id=instance)
        again = await client.invoke("one", {"order": 7}, message_id=instance)
    assert first == again == {"by": "w-1"}
    assert other.value.reason == "duplicate_id"
    assert f"{instance!r} is of an earlier request of yours, which had another payload" in str(
        other.value
    )
    assert counts["w-1"] == 1
