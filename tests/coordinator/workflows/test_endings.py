"""An instance's ending event (``workflow_completed`` / ``_failed`` / ``_cancelled``) is
published once, even when the coordinator stops between writing the ended record and
publishing it: the message that ended it comes back and publishes what is missing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest

from agentreach.agents import ReachClient
from agentreach.broker import Broker, BrokerError
from agentreach.broker.direct import messages_on
from agentreach.broker.lifecycle import event_for, event_message
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows.actions import ending
from agentreach.coordinator.workflows.outbox import Outbox
from agentreach.envelopes import WorkflowRecord
from tests.e2e.routing_support import fast, serving, worker

FLOWS = {"one": wf.chain(wf.step("a", "work"))}


async def endings_of(broker: Broker, instance_id: str) -> list[Any]:
    names = broker.names
    subject = names.event("workflow_completed", "one", "*", instance_id, "*")
    return await messages_on(broker, names.events_stream, subject)


async def test_an_ending_lost_to_a_crash_after_the_record_was_written_is_published_again(
    broker: Broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, worker("w1", Counter())),
        ReachClient(broker=broker) as client,
    ):
        outbox = coordinator.workflows._outbox
        note = outbox._note
        lost: list[str] = []

        async def crash_before_the_ending(
            record: WorkflowRecord, event: str, *rest: Any, **kw: Any
        ) -> None:
            if event == "workflow_completed" and not lost:
                lost.append(event)  # the record says completed; the event is never sent
                raise BrokerError("connection lost")
            await note(record, event, *rest, **kw)

        monkeypatch.setattr(outbox, "_note", crash_before_the_ending)
        result = await client.invoke("one", {"n": 1}, message_id="crashed")
        completed = await watcher.event("workflow_completed", message_id="crashed")
    assert result == {"by": "w1"}
    assert lost == ["workflow_completed"]
    assert completed.detail["result"] == {"by": "w1"}
    assert len(await endings_of(broker, "crashed")) == 1


async def test_an_ending_published_long_ago_is_not_published_again(
    broker: Broker, start_coordinator, watcher
) -> None:
    """Past the events' duplicate window the server would store a repeat: the coordinator
    looks for the ending first."""
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, worker("w1", Counter())),
        ReachClient(broker=broker) as client,
    ):
        await client.invoke("one", {"n": 1}, message_id="done")
        records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
        done = (await records.get("done")).value
    # Another ended instance, whose ending was sent before the window: under no id the
    # server still remembers.
    task = msgspec.structs.replace(done.task, message_id="long-ago")
    record = msgspec.structs.replace(done, task=task, instance_id="long-ago")
    note = ending(record)
    subject, data, _ = event_message(
        broker, event_for(task, note.event, workflow="one", **note.detail)
    )
    await broker.publish(subject, data, headers={"Nats-Msg-Id": "sent-before-the-window"})
    outbox = Outbox(broker, lambda _: (), lambda: record.ended_ms)
    await outbox.carry_out(record, [ending(record, again=True)])
    assert len(await endings_of(broker, "long-ago")) == 1
