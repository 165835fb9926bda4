"""After an outage of the server, a replica does what every unfinished instance's record
calls for, as at its start: actions the outage cut short are done even when the message
that made the change never comes back to the replica that owes them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, BrokerError, Names
from agentreach.coordinator import Coordinator, consumption
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import read_record
from agentreach.coordinator.workflows.actions import message_id_of
from agentreach.envelopes import WorkflowRecord
from tests.e2e.routing_support import fast
from tests.e2e.test_startup_and_restarts import RestartableServer
from tests.support import echoing, eventually, until_true

PAIR = {"pair": wf.chain(wf.step("a", "outage-first"), wf.step("b", "outage-second"))}


def cut_short_once(broker: Broker, subject: str, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """``broker``'s first publish on ``subject`` fails as in an outage; set once it did."""
    publish, cut_short = broker.publish, asyncio.Event()

    async def dying(to: str, data: bytes, **options: Any) -> Any:
        if to == subject and not cut_short.is_set():
            cut_short.set()
            raise BrokerError("the server went away")
        return await publish(to, data, **options)

    monkeypatch.setattr(broker, "publish", dying)
    return cut_short


async def test_a_step_an_outage_kept_from_being_sent_is_sent_once_the_server_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step `a`'s result was applied (the record says `b` runs) and the server went away
    before `b`'s task went out. The result's message comes back only after a minute here
    (and, from a server killed -9, as new, maybe to another replica, which finds nothing
    to change): the instance waited for its deadline. The replica, back from the outage,
    resumes every unfinished instance, and `b` is sent."""
    monkeypatch.setattr(consumption, "RETRY_DELAY_S", 60.0)  # the result is not seen again
    async with (
        RestartableServer(tmp_path / "nats") as server,
        Broker(server.url, names=Names(), name="coordinator", wait=True) as own,
    ):
        cut_short = cut_short_once(own, own.names.coordinator_task("outage-second"), monkeypatch)
        async with (
            Coordinator(own, fast(workflows=PAIR)).running(),
            echoing("outage-echo", "outage-first", "outage-second").running(server.url),
            ReachClient(server.url, name="outage-alice") as alice,
        ):
            await alice.publish("pair", {"n": 1}, message_id="cut-by-outage")
            await asyncio.wait_for(cut_short.wait(), 10)
            reconnects = own.reconnects
            await server.stop()
            await server.start()
            await eventually(lambda: own.reconnects > reconnects, 15)

            async def ended() -> WorkflowRecord | None:
                record = await read_record(own, "cut-by-outage")
                return record if record is not None and record.finished else None

            record = await until_true(ended, timeout=20)
    assert record.status == "completed", record.error
    assert record.steps["b"].status == "completed"


async def test_after_an_outage_only_the_instances_it_cut_short_are_resumed(
    broker: Broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resuming every instance changed lately sent their running steps again, and the
    server, restarted, no longer knew the ids of the step tasks consumed: 12 steps ran
    twice after one kill -9 (a chaos run). Only an instance whose actions a failure cut
    short on this replica is resumed (its deadline armed again); another is not. Neither's
    step is sent again: each was routed, and is the delivery's now."""
    gate = asyncio.Event()
    agent = Agent("outage-holder", startup_delay=0)

    @agent.handler("outage-first")
    async def first(ctx: TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    async with (
        start_coordinator(fast(workflows=PAIR)) as coordinator,
        agent.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        for instance in ("owed-one", "settled-one"):
            await client.publish("pair", {"n": 1}, message_id=instance)
            # Its step's task out and taken: all its record called for is done.
            await watcher.event("accepted", message_id=message_id_of(instance, "a", 1))
        engine = coordinator.workflows
        engine._outbox.owe("owed-one")
        sent: list[str] = []
        publish = engine._broker.publish

        async def noting(subject: str, data: bytes, **options: Any) -> Any:
            sent.append(subject)
            return await publish(subject, data, **options)

        monkeypatch.setattr(engine._broker, "publish", noting)
        await engine._settle_owed()
        monkeypatch.undo()
        gate.set()
    names = broker.names
    assert names.workflow_timer("owed-one") in sent
    assert names.workflow_timer("settled-one") not in sent
    assert names.coordinator_task("outage-first") not in sent
    assert not engine._outbox.owes("owed-one")
