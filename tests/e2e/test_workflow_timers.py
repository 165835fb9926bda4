"""A state's wait_s fires though another instance ended meanwhile.

An ended instance's timers used to be purged by subject. nats-server then moved the shared
consumer's ack floor past other instances' timers waiting on a delayed nak, which were never
delivered again: a state waited forever past its wait_s (a walkthrough saw it twice), and a
coordinator restart within the 2-minute duplicate window could not arm it again."""

from __future__ import annotations

from agentreach.agents import ReachClient
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import cancel, read_record
from tests.e2e.routing_support import fast
from tests.support import until_true


def waits(wait_s: float) -> wf.WorkflowSpec:
    return wf.machine(
        "asked",
        {
            "asked": wf.state(wait_s=wait_s, on_timeout="late", next=[wf.go("ok", event="ok")]),
            "ok": wf.state(terminal=True),
            "late": wf.state(terminal=True),
        },
        ttl_s=3600,
    )


async def test_a_wait_fires_though_another_instance_was_cancelled_meanwhile(
    broker, start_coordinator
):
    flows = {"soon": waits(2.0), "later": waits(60.0)}
    async with start_coordinator(fast(workflows=flows)), ReachClient(broker=broker) as client:
        soon, _ = await client.publish("soon", {}, message_id="soon-1", ttl_ms=3_600_000)
        await until_true(lambda: read_record(broker, soon))
        later, _ = await client.publish("later", {}, message_id="later-1", ttl_ms=3_600_000)
        await until_true(lambda: read_record(broker, later))
        await cancel(broker, later, why="not needed")

        async def ended() -> bool:
            record = await read_record(broker, soon)
            return record is not None and record.finished

        await until_true(ended, timeout=15)
        record = await read_record(broker, soon)
    assert record is not None and record.current == "late"
