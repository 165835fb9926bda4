"""Manual review end to end: what people do with a task that waits for them (answer, send
on, reject, take), and what becomes of one nobody answers."""

from __future__ import annotations

import msgspec

from agentreach import envelopes
from agentreach.agents import ManualReview, ManualReviewError, ReachClient
from agentreach.agents.letters import replay
from agentreach.coordinator.routing.manual import ManualConfig
from tests.e2e.intent_support import (
    UNSURE,
    Caller,
    overlapping_agents,
)
from tests.e2e.routing_support import fast, serving, table
from tests.secured import operators_reply_to


async def test_nobody_answering_in_time_ends_the_task_as_expired(
    broker, start_coordinator, watcher
):
    """A manual-review item still open after `manual.ttl_s` is dead-lettered as expired and
    the caller gets the error; nobody can answer it afterwards."""
    config = fast(manual=ManualConfig(ttl_s=0.3))
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
        Caller(broker, broker.names.reply_box("client", "late")) as caller,
    ):
        message_id, _ = await client.publish("auto", {"text": UNSURE}, reply_to=caller.subject)
        letter = await watcher.dead_letter("expired", message_id=message_id)
        error = await caller.reply(message_id, "error")
        try:
            await ManualReview(broker, by="alice").answer(message_id, {})
            raise AssertionError("an expired item was answered")
        except ManualReviewError as exc:
            assert "expired" in str(exc)
    assert letter.error is not None and "manual-review queue 'review'" in letter.error.message
    assert error.error.type == "expired"  # type: ignore[union-attr]


async def test_an_unsure_task_s_letter_keeps_its_topic_so_a_replay_is_resolved_again(
    broker, start_coordinator, watcher
):
    """Not sure enough, dead-lettered (a `below: {dlq: …}` rule, or a review that expired):
    the letter is on `auto` with the guess in its resolution, so a replay of it waits for a
    person again instead of delivering the guess the threshold held back."""
    rules = table("""
below: {dlq: unsure}
rules:
  - name: default
    fallback: true
    to: {}
""")
    async with (
        start_coordinator(fast(routing=rules)) as coordinator,
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        message_id, _ = await client.publish("auto", {"text": UNSURE})
        unsure = await watcher.dead_letter("unsure", message_id=message_id)
    async with (
        start_coordinator(fast(manual=ManualConfig(ttl_s=0.3))) as coordinator,
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        message_id, _ = await client.publish("auto", {"text": UNSURE})
        expired = await watcher.dead_letter("expired", message_id=message_id)
        again = await replay(broker, expired)
        await watcher.event("routed", message_id=again.message_id)
        (item,) = await ManualReview(broker).items()
    for letter in (unsure, expired):
        assert letter.topic == "auto" and letter.envelope is not None
        assert letter.envelope.topic == "auto" and letter.envelope.resolution is not None
    assert unsure.error is not None and "below 0.75 for rule 'default'" in unsure.error.message
    assert "over" in unsure.error.message  # the confidences, not only the guess
    assert item.message_id == again.message_id and item.task.topic == "auto"
    assert not [e for e in watcher.events if e.event == "routed" and e.agent_id]


async def test_a_person_sends_the_task_on_and_the_caller_gets_that_agents_answer(
    broker, coordinator, watcher
):
    """`send` republishes the waiting task on the topic a person chose, in the same trace and
    to the same caller."""
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
        Caller(broker, broker.names.reply_box("client", "sent")) as caller,
    ):
        message_id, trace_id = await client.publish(
            "auto", {"text": UNSURE}, reply_to=caller.subject
        )
        await caller.reply(message_id, "ack")
        carol = ManualReview(broker, by="carol")
        try:
            await carol.send(message_id, "risk_reveiw")
            raise AssertionError("sent to a topic nobody serves")
        except ManualReviewError as exc:
            typo = str(exc)
        assert (await carol.get(message_id)).open  # still there to be sent right
        item = await carol.send(message_id, "risk_review")
        result = await caller.reply(item.sent_as, "result")
        sent = await watcher.event("manual_sent", message_id=message_id)
        completed = await watcher.event("completed", message_id=item.sent_as)
    assert item.sent_to == "risk_review" and completed.trace_id == trace_id
    assert result.result == {"frozen": True, "by": "risk-control"}  # type: ignore[union-attr]
    assert sent.detail["sent_as"] == item.sent_as and sent.detail["by"] == "carol"
    assert "no registered agent serves topic 'risk_reveiw'" in typo
    assert "served: refund_application, risk_review" in typo


async def test_a_take_holds_for_a_positive_time_and_at_most_until_the_item_expires(
    broker, start_coordinator, watcher
):
    """`take` for 0 or fewer seconds is refused; one for longer than the item has left holds
    until it expires, and says so."""
    async with (
        start_coordinator(fast(manual=ManualConfig(ttl_s=60))) as coordinator,
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        message_id, _ = await client.publish("auto", {"text": UNSURE})
        await watcher.event("routed", message_id=message_id)
        alice = ManualReview(broker, by="alice")
        refusals = []
        for take_s in (0, -5):
            try:
                await alice.take(message_id, take_s=take_s)
            except ManualReviewError as exc:
                refusals.append(str(exc))
        item = await alice.take(message_id, take_s=900)
    assert len(refusals) == 2 and "more than 0" in refusals[1] and "got -5" in refusals[1]
    assert item.taken_until_ms == item.deadline_ms


async def test_a_review_is_not_another_caller_s_under_the_same_message_id(
    broker, coordinator, watcher
):
    """Items are kept by message id: mallory sent a task of her own under the id of alice's
    answered one, and was sent alice's answer. It is refused as `duplicate_id` now, and
    alice's answer is hers alone."""
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker, name="alice") as alice,
        ReachClient(broker=broker, name="mallory") as mallory,
        Caller(broker, broker.names.reply_box("alice", "refund")) as hers,
        Caller(broker, broker.names.reply_box("mallory", "refund")) as theirs,
    ):
        message_id, _ = await alice.publish(
            "auto", {"text": UNSURE}, message_id="refund-5", reply_to=hers.subject
        )
        await hers.reply(message_id, "ack")
        await ManualReview(broker, by="carol").answer(message_id, {"refund": "ALICE-OK"})
        answered = await hers.reply(message_id, "result")
        # With no Nats-Msg-Id: the intake's dedup window would drop it (its id is alice's).
        own = mallory.task("auto", {"text": UNSURE}, message_id="refund-5")
        own = msgspec.structs.replace(own, reply_to=theirs.subject)
        await broker.publish(broker.names.task("auto", "mallory"), envelopes.encode(own))
        refused = await theirs.reply(message_id, "error")
        letter = await watcher.dead_letter("rejected", message_id=message_id)
    assert answered.result == {"refund": "ALICE-OK"}  # type: ignore[union-attr]
    assert refused.error.type == "duplicate_id"  # type: ignore[union-attr]
    assert "answered in manual review for another caller's" in refused.error.message  # type: ignore[union-attr]
    assert not [r for r in theirs.replies if isinstance(r, envelopes.Result)]
    assert letter.envelope is not None and letter.envelope.caller == "mallory"


async def test_an_answer_given_while_no_coordinator_runs_reaches_the_caller_later(
    broker, start_coordinator, watcher
):
    """People change only the record: an answer written while every coordinator is down is
    carried out by the next one to hold the lease."""
    agents = overlapping_agents()
    reply_to, _ = operators_reply_to(broker, "restart")  # secured: the operator's own box
    async with Caller(broker, reply_to) as caller:
        async with start_coordinator(fast()) as coordinator, serving(broker, coordinator, *agents):
            await broker.publish(  # the operator's bare form
                broker.names.task("auto"),
                msgspec.json.encode({"text": UNSURE}),
                headers={"Nats-Msg-Id": "restart-1", "Reach-Reply-To": caller.subject},
            )
            await caller.reply("restart-1", "progress")
        await ManualReview(broker, by="dora").answer("restart-1", {"late": True})
        assert [r for r in caller.replies if type(r).__struct_config__.tag == "result"] == []
        async with start_coordinator(fast()):
            result = await caller.reply("restart-1", "result")
            completed = await watcher.event("completed", message_id="restart-1")
    assert result.result == {"late": True}  # type: ignore[union-attr]
    assert completed.detail["answered_by"] == "dora"


async def test_a_person_rejects_the_task_and_it_is_dead_lettered_with_their_reason(
    broker, coordinator, watcher
):
    """`reject` ends the task: dead-lettered as `rejected` with the person's reason, which the
    caller gets as its error; nobody can answer it afterwards."""
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
        Caller(broker, broker.names.reply_box("client", "rejected")) as caller,
    ):
        message_id, _ = await client.publish("auto", {"text": UNSURE}, reply_to=caller.subject)
        await caller.reply(message_id, "ack")
        dave = ManualReview(broker, by="dave")
        try:
            await dave.reject(message_id, "  ")
            raise AssertionError("rejected without a reason")
        except ManualReviewError as exc:
            assert "say why" in str(exc)
        await dave.reject(message_id, "weather questions are not ours")
        letter = await watcher.dead_letter("rejected", message_id=message_id)
        error = await caller.reply(message_id, "error")
        rejected = await watcher.event("manual_rejected", message_id=message_id)
        try:
            await dave.answer(message_id, {"late": True})
            raise AssertionError("a rejected item was answered")
        except ManualReviewError as exc:
            refused = str(exc)
    said = "rejected by dave in manual-review queue 'review': weather questions are not ours"
    assert letter.error is not None and letter.error.message == said
    assert error.error.message == said and not error.error.retryable  # type: ignore[union-attr]
    assert letter.topic == "auto" and rejected.detail["by"] == "dave"
    assert refused == f"{message_id} was rejected by dave: weather questions are not ours"
