from __future__ import annotations

import asyncio

import pytest

from agentreach.agents import ReachClient
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import read_record
from tests.e2e.routing_support import fast
import msgspec
from agentreach.coordinator.workflows.spec import WorkflowSpec

APPROVAL = """
ttl_s: 3600
states:
  initial: asked
  states:
    asked:
      wait_s: 4
      on_timeout: expired
      next:
        - {event: approve, to: approved}
    approved: {terminal: true}
    expired: {terminal: true}
"""


@pytest.mark.parametrize("changed", [False, True, False, True])
async def test_probe(broker, start_coordinator, changed):
    spec = msgspec.yaml.decode(APPROVAL.encode(), type=WorkflowSpec)
    first = {"approval": spec}
    second = {"approval": spec, "extra": wf.chain(wf.step("x", "work"))} if changed else first
    async with ReachClient(broker=broker) as client:
        async with start_coordinator(fast(workflows=first)):
            iid, _ = await client.publish("approval", {"doc": "x"}, ttl_ms=3_600_000)
            await asyncio.sleep(3.0)
        await asyncio.sleep(0.5)
        async with start_coordinator(fast(workflows=second)):
            for _ in range(40):
                record = await read_record(broker, iid)
                if record is not None and record.finished:
                    break
                await asyncio.sleep(0.25)
    assert record is not None and record.finished, record
