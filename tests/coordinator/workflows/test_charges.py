"""A caller's signals and cancels charged to its quota: what is left of one once it was
refused or acted on (tests/agents/test_workflow_control.py has what a caller hears)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from nats.aio.msg import Msg

from agentreach.agents import ReachClient, WorkflowActionRefused
from agentreach.broker import Broker, Names
from agentreach.broker.streams import get_message
from agentreach.coordinator import Coordinator, RateLimits
from agentreach.coordinator.workflows import read_record
from agentreach.envelopes import RateLimit
from tests.agents.test_workflow_control import STEPS, approval_waiting
from tests.conftest import FAST
from tests.e2e.test_startup_and_restarts import RestartableServer
from tests.e2e.test_workflows import workflows


async def test_a_refused_signal_is_gone_from_the_stream_before_its_caller_is_told(broker):
    """A server that dies with acknowledgements it had not applied yet (a flood's) delivers
    those messages again, as new: a signal refused for its caller's quota was taken after a
    restart (an outside re-test, 1 run in 5). Its acknowledgement is applied (the work
    queue's message gone) before the refusal is said: by then it can come back no more."""
    quota = RateLimits(callers={"alice": RateLimit(rate=0.05, burst=2)})
    stream = broker.names.workflows_stream
    left_when_told: list[object] = []

    async def on_refusal(msg: Msg) -> None:
        seq = msgspec.json.decode(msg.data)["detail"]["signal_seq"]
        left_when_told.append(await get_message(broker, stream, seq))

    async with (
        ReachClient(broker=broker, name="alice") as alice,
        approval_waiting(broker, alice, rate_limits=quota) as (instance, _),
    ):
        assert not (await alice.signal_workflow(instance, "nope")).taken  # the second token
        subject = f"{broker.names.prefix}.event.signal_ignored.>"
        refusals = await broker.nc.subscribe(subject, cb=on_refusal)
        with pytest.raises(WorkflowActionRefused):
            await alice.signal_workflow(instance, "approve")
        await refusals.unsubscribe()
    assert left_when_told == [None]


async def test_a_signal_taken_before_a_server_crash_is_not_taken_again(tmp_path: Path):
    """The server killed just after the signal `go` moved the machine from `first` to
    `second`: had it not applied the acknowledgement yet, `go` would come again, as new,
    and move the machine to `done` on one signal. Acknowledged, and applied, once acted
    on, it does not: a signal sent after the restart, which no state takes, is answered
    while the machine still waits in `second`."""
    config = msgspec.structs.replace(FAST, workflows=workflows(steps=STEPS))
    async with (
        RestartableServer(tmp_path / "nats") as server,
        Broker(server.url, names=Names(), name="coordinator", wait=True) as own,
        Coordinator(own, config).running(),
        ReachClient(server.url, name="alice") as alice,
    ):
        instance, _ = await alice.publish("steps", {})
        assert (await alice.signal_workflow(instance, "go")).state == "first"
        await server.kill()
        await server.start()
        after = await alice.signal_workflow(instance, "stay", wait_s=30)
        record = await read_record(own, instance)
    assert after.waits_for == ("go",)  # the machine waits in `second`: `go` came once
    assert record is not None and record.current == "second"
