"""A workflow step that waits for a person (a rule sends its intent to a manual-review queue)
does not outlive its workflow, on a real server: once the workflow no longer waits for it,
its item is withdrawn, an answer is refused naming the workflow, and nothing is recorded as
`completed` for it."""

from __future__ import annotations

import msgspec
import pytest

from agentreach.agents import ManualReview, ManualReviewError, ReachClient
from agentreach.broker import Broker
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import cancel
from agentreach.coordinator.workflows.actions import message_id_of
from agentreach.envelopes import ManualItem, WorkflowRecord
from tests.cli.conftest import reach_argv, run
from tests.e2e.routing_support import fast, table
from tests.support import Watcher, until_true

ROUTES = table("""
rules:
  - {name: to-people, match: {topic: approve}, to: {manual: desk}}
  - {name: fallback, fallback: true, to: {}}
""")
FLOWS = {
    "approval": wf.chain(wf.step("check", "approve")),
    "approval_in_time": wf.chain(wf.step("check", "approve", timeout_s=0.5, on_timeout="fail")),
}
CONFIG = fast(routing=ROUTES, workflows=FLOWS)


async def _waiting_for_a_person(client: ReachClient, watcher: Watcher, flow: str, instance: str):  # type: ignore[no-untyped-def]
    """Start ``flow`` as ``instance``; the message id of its step, once a person may take it."""
    await client.publish(flow, {"amount": 120}, message_id=instance)
    step_id = message_id_of(instance, "check", 1)
    routed = await watcher.event("routed", message_id=step_id)
    assert routed.detail["manual"] == "desk"
    return step_id


async def _item(broker: Broker, message_id: str) -> ManualItem:
    bucket = await broker.bucket(broker.names.manual_bucket, ManualItem)
    entry = await bucket.get(message_id)
    assert entry is not None
    return entry.value


async def test_a_cancelled_workflow_withdraws_its_step_s_item_and_refuses_an_answer(
    broker, start_coordinator, watcher
):
    """Cancelled while its step waits for a person: the item is withdrawn (event
    `manual_withdrawn`, naming the workflow), `reach manual answer` afterwards exits 1 with
    one line saying its workflow no longer waits, and the step is never `completed`."""
    async with start_coordinator(CONFIG), ReachClient(broker=broker) as client:
        step_id = await _waiting_for_a_person(client, watcher, "approval", "appr-1")
        await cancel(broker, "appr-1")
        withdrawn = await watcher.event("manual_withdrawn", message_id=step_id)
        answered = await run(
            *reach_argv(broker, "manual", "answer", step_id, '{"ok": true}', "--as", "bob")
        )
        with pytest.raises(ManualReviewError) as refused:
            await ManualReview(broker, by="bob").answer(step_id, {"ok": True})
        item = await _item(broker, step_id)
    assert "step 'check' of workflow 'appr-1' is cancelled" in withdrawn.detail["why"]
    assert answered.returncode == 1
    line = answered.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert f"{step_id} was withdrawn: its workflow no longer waits for an answer" in line
    assert "workflow 'appr-1' is cancelled" in line
    assert "workflow 'appr-1' is cancelled" in str(refused.value)
    assert item.status == "withdrawn" and item.answer is None
    assert not [e for e in watcher.events if e.event == "completed" and e.message_id == step_id]


async def test_a_step_that_timed_out_withdraws_its_item(broker, start_coordinator, watcher):
    """A step past its `timeout_s` while it waits for a person fails its workflow; the
    item is withdrawn and can no longer be taken."""
    async with start_coordinator(CONFIG), ReachClient(broker=broker) as client:
        step_id = await _waiting_for_a_person(client, watcher, "approval_in_time", "appr-2")
        item = await _item(broker, step_id)
        # Its deadline is the step's (withdrawn at 0.5 s), not the queue's day.
        assert item.deadline_ms - item.entered_ms <= 500 + 5_000
        await watcher.event("workflow_failed", message_id="appr-2")
        await watcher.event("manual_withdrawn", message_id=step_id)
        with pytest.raises(ManualReviewError) as refused:
            await ManualReview(broker, by="bob").take(step_id)
    assert "step 'check' of workflow 'appr-2' is timed_out" in str(refused.value)


async def test_an_answer_written_after_the_workflow_ended_is_not_carried_out(
    broker, start_coordinator, watcher
):
    """While no coordinator runs, the workflow is ended and a person's answer written
    straight into the bucket (as a client of before this check would): the coordinator,
    started again, does not send it or record it `completed`, but withdraws the item and
    says whose answer was not sent."""
    async with start_coordinator(CONFIG), ReachClient(broker=broker) as client:
        step_id = await _waiting_for_a_person(client, watcher, "approval", "appr-3")
        await until_true(lambda: _item_status_is(broker, step_id, "waiting"))
    records = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)

    def ended(record: WorkflowRecord | None) -> WorkflowRecord | None:
        assert record is not None and record.status == "running"
        record.steps["check"].status = "cancelled"
        return msgspec.structs.replace(record, status="cancelled", ended_ms=1)

    assert (await records.cas("appr-3", ended)).written
    items = await broker.bucket(broker.names.manual_bucket, ManualItem)

    def answered(item: ManualItem | None) -> ManualItem | None:
        assert item is not None
        return msgspec.structs.replace(item, status="answered", answer={"ok": 1}, ended_by="bob")

    assert (await items.cas(step_id, answered)).written
    async with start_coordinator(CONFIG):
        withdrawn = await watcher.event("manual_withdrawn", message_id=step_id)
    assert withdrawn.detail["not_sent_for"] == "bob"
    assert not [e for e in watcher.events if e.event == "completed" and e.message_id == step_id]
    assert (await _item(broker, step_id)).status == "withdrawn"


async def _item_status_is(broker: Broker, message_id: str, status: str) -> bool:
    bucket = await broker.bucket(broker.names.manual_bucket, ManualItem)
    entry = await bucket.get(message_id)
    return entry is not None and entry.value.status == status
