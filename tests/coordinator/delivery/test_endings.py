"""A message ends once: a completion after its dead letter (an agent that ignored its fence)
is alerted and resolves the letter, a result sent again counts once, and an ending that is
not an event is dead-lettered with its bytes. Against a real nats-server."""

from __future__ import annotations

from agentreach.agents.letters import settling_of
from agentreach.broker import read_stream
from agentreach.broker.lifecycle import emit, event_for, event_message
from agentreach.broker.names import COORDINATOR
from agentreach.coordinator.routing.run_once import answer_from_record
from agentreach.envelopes import AuditRecord, Event, Execution, Task, decode_as
from agentreach.envelopes import headers as h
from tests.coordinator.observability.test_metrics import replica
from tests.scrape import scrape, total
from tests.support import Watcher, events_settled, letter_of, until_true


def ended_twice(watcher: Watcher) -> Event | None:
    alerts = (e for e in watcher.events if e.event == "alert")
    return next((e for e in alerts if e.detail.get("problem") == "ended_twice"), None)


async def test_a_completion_after_its_dead_letter_is_alerted_and_resolves_the_letter(
    broker, watcher: Watcher
):
    """`expired` in the DLQ, then the agent it was routed to says `completed` (it ignored
    the fence): an `ended_twice` alert naming it, the letter resolved by the coordinator (no
    worker replays work that was done), one finished task counted, one audit record."""
    task = Task(v=1, message_id="twice-1", trace_id="twice-1", topic="double")
    async with replica(broker) as running:
        await emit(broker, event_for(task, "routed", agent_id="liar"))
        letter = await letter_of(broker, task, reason="expired")
        done = event_for(task, "completed", agent_id="liar", result={"n": 2})
        await emit(broker, done, sender="liar")
        alert = await watcher.until(lambda: ended_twice(watcher), "an ended_twice alert")
        settled = await until_true(lambda: settling_of(broker, letter))

        async def counted() -> dict | None:
            found = await scrape(running.metrics_url)
            return found if total(found, "reach_alerts_total", problem="ended_twice") else None

        found = await until_true(counted)
        audit = broker.names
        records = await read_stream(broker, audit.audit_stream, audit.audit_of_message("twice-1"))
    assert alert.agent_id == "liar" and alert.detail["message_id"] == "twice-1"
    assert "completed by liar after it was dead-lettered (expired)" in alert.detail["why"]
    assert [e.event for e in settled] == ["resolved"]
    assert settled[0].detail["by"] == COORDINATOR
    assert total(found, "reach_tasks_finished_total") == 1
    assert [decode_as(r.data, AuditRecord).status for r in records] == ["dead_lettered"]


async def test_a_result_sent_again_counts_once_and_alerts_nothing(broker, watcher: Watcher):
    """An agent answering a redelivery of a task it ran sends `completed` again (past the
    stream's dedup window: stored twice): one finished task, no alert."""
    task = Task(v=1, message_id="again-1", trace_id="again-1", topic="double")
    async with replica(broker) as running:
        await emit(broker, event_for(task, "routed", agent_id="honest"))
        for n in (1, 2):
            done = event_for(task, "completed", agent_id="honest", result={"n": n})
            subject, data, headers = event_message(broker, done, sender="honest")
            await broker.publish(subject, data, headers={**headers, h.MSG_ID: f"again-{n}"})

        async def both_counted() -> dict | None:
            found = await scrape(running.metrics_url)
            folded = total(found, "reach_events_folded_total", event="completed")
            return found if folded == 2 else None

        found = await until_true(both_counted)
    assert total(found, "reach_tasks_finished_total") == 1
    assert ended_twice(watcher) is None


async def test_an_ending_that_is_not_an_event_is_dead_lettered_with_its_bytes(
    broker, watcher: Watcher
):
    """`nats pub reach.event.completed.… 'not json at all'`: it was dropped without a word;
    now its bytes are in REACH_DLQ as `invalid_envelope`."""
    subject = broker.names.event("completed", "double", "junk-1", "junk-1", "liar")
    async with replica(broker):
        await broker.publish(subject, b"not json at all", headers={"Nats-Msg-Id": "junk-1"})
        letter = await watcher.dead_letter("invalid_envelope")
    assert letter.raw == "not json at all"
    assert letter.error is not None and "JSON" in letter.error.message


async def test_a_sender_s_unreadable_events_get_one_letter_a_minute(broker, watcher: Watcher):
    """An agent publishing garbage on its own event subjects had a dead letter (kept 30
    days) and an error line for each: 500 of them, 500 letters (security re-test). Now one
    a minute of each sender; one without headers is a server's answer aimed at the subject
    (every event but `progress` carries headers)."""
    names = broker.names
    async with replica(broker):
        for n in range(5):
            subject = names.event("failed", "double", f"junk-{n}", f"junk-{n}", "liar")
            await broker.publish(subject, b"garbage", headers={"Nats-Msg-Id": f"junk-{n}"})
        honest = names.event("failed", "double", "junk-h", "junk-h", "broken")
        await broker.publish(honest, b"garbage too", headers={"Nats-Msg-Id": "junk-h"})
        copy = names.event("failed", "double", "junk-c", "junk-c", "bob")
        await broker.publish(copy, b"{}")  # what a direct get with no headers answers
        await events_settled(broker, names.coordinator_outcomes)

        def letters() -> list[str]:
            return sorted(x.raw or "" for x in watcher.dead_letters)

        await watcher.until(lambda: len(letters()) >= 3 or None, "three letters")
    assert letters() == ["garbage", "garbage too", "{}"]
    copied = next(x for x in watcher.dead_letters if x.raw == "{}")
    assert copied.error is not None and "no headers" in copied.error.message


async def test_another_caller_s_run_under_the_id_ends_only_its_own_message(
    broker, watcher: Watcher
):
    """mallory had her own task under alice's dead-lettered message id routed to herself
    and completed it: alice's letter was resolved as ended twice ("completed by mallory"),
    and mallory's audit record was the only one. Each run ends its own caller's message."""
    alice = Task(v=1, message_id="shared-7", trace_id="shared-7", topic="pay", caller="alice")
    own = Task(v=1, message_id="shared-7", trace_id="shared-7", topic="mine", caller="mallory")
    async with replica(broker):
        await emit(broker, event_for(alice, "routed", agent_id="bob"))
        letter = await letter_of(broker, alice, reason="expired")
        await emit(broker, event_for(own, "routed", agent_id="mallory"))
        done = event_for(own, "completed", agent_id="mallory", result={"forged": True})
        await emit(broker, done, sender="mallory")
        names = broker.names

        async def both_audited() -> list[AuditRecord]:
            of_message = names.audit_of_message("shared-7")
            found = await read_stream(broker, names.audit_stream, of_message)
            return [decode_as(r.data, AuditRecord) for r in found] if len(found) == 2 else []

        records = await until_true(both_audited)
    assert ended_twice(watcher) is None
    assert await settling_of(broker, letter) == []
    shown = sorted((r.status, r.topic, tuple(r.agents)) for r in records)
    assert shown == [("completed", "mine", ("mallory",)), ("dead_lettered", "pay", ("bob",))]


async def test_a_run_answered_from_its_record_ends_though_another_caller_s_run_ended(
    broker, watcher: Watcher
):
    """bob recorded alice's result and died before saying `completed`; the coordinator says
    it for him from the record, unless the message ended. mallory's letter under the same id
    was taken for its end: alice's never came (a security re-test)."""
    alice = Task(v=1, message_id="shared-8", trace_id="shared-8", topic="pay", caller="alice")
    own = Task(v=1, message_id="shared-8", trace_id="shared-8", topic="mine", caller="mallory")
    await letter_of(broker, own, reason="no_route")
    await emit(broker, event_for(alice, "routed", agent_id="bob"))
    record = Execution(message_id="shared-8", state="done", agent_id="bob", caller="alice",
                       result="R-88")  # fmt: skip
    await answer_from_record(broker, alice, record)
    done = await watcher.event("completed", message_id="shared-8")
    assert (done.caller, done.detail.get("result")) == ("alice", "R-88")
