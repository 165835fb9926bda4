"""Intent resolution end to end: free text on reach.task.auto reaches the agent whose
description it matches, with its confidence recorded; unsure requests wait for a person."""

from __future__ import annotations

import msgspec

from agentreach import envelopes
from agentreach.agents import ManualReview, ManualReviewError, ReachClient
from agentreach.agents.letters import replay
from agentreach.coordinator.routing.manual import ManualConfig
from agentreach.envelopes import Progress
from agentreach.envelopes import headers as h
from tests.e2e.intent_support import (
    BARE,
    SURE_REFUND,
    SURE_RISK,
    UNSURE,
    Caller,
    overlapping_agents,
)
from tests.e2e.routing_support import fast, serving, table
from tests.secured import operators_reply_to


async def test_free_text_reaches_the_described_agent_with_its_confidence(
    broker, coordinator, watcher
):
    """A request on `auto` is resolved to the intent whose words it uses; the routed event
    names the best intent, its confidence and the runner-up."""
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        refund = await client.invoke("auto", {"text": SURE_REFUND})
        risk = await client.invoke("auto", SURE_RISK)  # a string payload is the text itself
    assert refund == {"refunded": True, "by": "customer-service"}
    assert risk == {"frozen": True, "by": "risk-control"}
    routed = [e for e in watcher.events if e.event == "routed"]
    assert [e.topic for e in routed] == ["refund_application", "risk_review"]
    resolution = routed[0].detail["resolution"]
    assert resolution["topic"] == "auto" and resolution["scorer"] == "bm25"
    assert resolution["best"]["intent"] == "refund_application"
    assert resolution["best"]["confidence"] >= routed[0].detail["needed"] == 0.75
    assert resolution["runner_up"]["intent"] == "risk_review"
    assert resolution["runner_up"]["confidence"] < 0.5


async def test_a_bare_word_waits_for_a_person_while_the_full_request_is_delivered(
    broker, coordinator, watcher
):
    """A one-word request on `auto` that one intent's example contains ("blender") is not
    sure enough to deliver: it waits in the manual-review queue, while a full request with the
    same intent reaches the agent."""
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        full = await client.invoke("auto", {"text": SURE_REFUND})
        bare, _ = await client.publish("auto", {"text": BARE})
        routed = await watcher.until(
            lambda: next(
                (e for e in watcher.events if e.event == "routed" and e.message_id == bare),
                None,
            ),
            "the bare word routed",
        )
        (item,) = await ManualReview(broker).items()
    assert full == {"refunded": True, "by": "customer-service"}
    best = routed.detail["resolution"]["best"]
    assert best["intent"] == "refund_application" and best["confidence"] < 0.75
    assert routed.detail["manual"] == "review" and routed.agent_id is None
    assert item.message_id == bare and "below 0.75 for rule 'default'" in item.reason


async def test_an_unsure_request_waits_for_a_person_whose_answer_the_caller_gets(
    broker, coordinator, watcher
):
    """Below the threshold the task is not delivered: the caller is told it waits for a
    person, `ManualReview` lists it, one person answers, and that is the caller's result."""
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
        Caller(broker, broker.names.reply_box("client", "unsure")) as caller,
    ):
        message_id, _ = await client.publish("auto", {"text": UNSURE}, reply_to=caller.subject)
        progress = await caller.reply(message_id, "progress")
        assert isinstance(progress, Progress) and "manual-review queue 'review'" in progress.note
        await caller.reply(message_id, "ack")
        alice, bob = ManualReview(broker, by="alice"), ManualReview(broker, by="bob")
        (item,) = await alice.items()
        assert item.message_id == message_id and item.queue == "review"
        assert item.task.resolution is not None and item.task.resolution.confidence < 0.75
        assert "below 0.75 for rule 'default'" in item.reason
        await alice.take(message_id)
        try:
            await bob.answer(message_id, {"refunded": False})
            raise AssertionError("bob answered an item alice holds")
        except ManualReviewError as exc:
            assert "taken by alice" in str(exc)
        await alice.answer(message_id, {"refunded": True, "note": "duplicate charge"})
        result = await caller.reply(message_id, "result")
        completed = await watcher.event("completed", message_id=message_id)
        assert await alice.items() == []
        try:
            await bob.answer(message_id, {"twice": True})
            raise AssertionError("answered twice")
        except ManualReviewError as exc:
            assert "was answered by alice" in str(exc)
    assert result.result == {"refunded": True, "note": "duplicate charge"}  # type: ignore[union-attr]
    assert completed.detail["answered_by"] == "alice" and completed.agent_id is None
    assert not [e for e in watcher.events if e.event == "routed" and e.agent_id]


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
        (item,) = await ManualReview(broker).items()
    for letter in (unsure, expired):
        assert letter.topic == "auto" and letter.envelope is not None
        assert letter.envelope.topic == "auto" and letter.envelope.resolution is not None
    assert unsure.error is not None and "below 0.75 for rule 'default'" in unsure.error.message
    assert "over" in unsure.error.message  # the confidences, not only the guess
    assert item.message_id == again.message_id and item.task.topic == "auto"
    assert not [e for e in watcher.events if e.event == "routed" and e.agent_id]


async def test_seed_table_routes_by_resolved_intent_and_confidence(
    broker, start_coordinator, watcher
):
    """Rules read as `intent → destination, confidence, fallback`: a sure request goes to the
    rule's agent, an unsure one to that rule's own below queue; a named topic is untouched."""
    rules = table("""
rules:
  - name: fraud
    match: {topic: risk_review}
    min_confidence: 0.9
    to: {agent: risk-control}
    below: {manual: fraud-desk}
  - name: fallback
    fallback: true
    to: {}
""")
    async with (
        start_coordinator(fast(routing=rules)) as coordinator,
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        assert (await client.invoke("auto", {"text": SURE_RISK}))["by"] == "risk-control"
        named = await client.invoke("risk_review", {"text": "anything at all"})
        unsure, _ = await client.publish("auto", {"text": UNSURE})
        waiting = await watcher.until(
            lambda: next(
                (e for e in watcher.events if e.event == "routed" and e.message_id == unsure),
                None,
            ),
            "the unsure task routed",
        )
        (item,) = await ManualReview(broker).items(queue="fraud-desk")
    assert named == {"frozen": True, "by": "risk-control"}
    assert waiting.detail["manual"] == "fraud-desk" and waiting.detail["rule"] == "fraud"
    assert waiting.detail["resolution"]["best"]["intent"] == "risk_review"
    assert item.message_id == unsure and "below 0.90 for rule 'fraud'" in item.reason


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
        item = await ManualReview(broker, by="carol").send(message_id, "risk_review")
        result = await caller.reply(item.sent_as, "result")
        sent = await watcher.event("manual_sent", message_id=message_id)
        completed = await watcher.event("completed", message_id=item.sent_as)
    assert item.sent_to == "risk_review" and completed.trace_id == trace_id
    assert result.result == {"frozen": True, "by": "risk-control"}  # type: ignore[union-attr]
    assert sent.detail["sent_as"] == item.sent_as and sent.detail["by"] == "carol"


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


async def test_no_text_goes_to_a_person_and_unknown_topics_resolve_when_enabled(
    broker, start_coordinator, watcher
):
    """`auto` without text has nothing to match: a person looks at it. With
    `unknown_topics`, a topic nobody serves is resolved from its text; one served is not."""
    rules = table(
        "resolve: {unknown_topics: true, text_field: body.text}\nrules: "
        "[{name: fallback, fallback: true, to: {}}]"
    )
    async with (
        start_coordinator(fast(routing=rules)) as coordinator,
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        blank, _ = await client.publish("auto", {"order": 7})
        guessed = await client.invoke("please_help", {"body": {"text": SURE_RISK}})
        await watcher.event("routed", message_id=blank)
        (item,) = await ManualReview(broker).items()
    assert guessed == {"frozen": True, "by": "risk-control"}
    assert item.message_id == blank and "no text to resolve at payload.body.text" in item.reason
    routed = [e for e in watcher.events if e.event == "routed" and e.agent_id == "risk-control"]
    assert routed[0].detail["resolution"]["topic"] == "please_help"
    assert msgspec.to_builtins(item.task.payload) == {"order": 7}


async def test_a_resolution_sent_by_a_producer_is_ignored(broker, coordinator, watcher):
    """Only the coordinator resolves: a full envelope claiming a low confidence for a named
    topic is routed as the named topic it is (confidence 1), not to a person."""
    from agentreach.envelopes import Candidate, Resolution

    async with (
        serving(broker, coordinator, *overlapping_agents()),
        ReachClient(broker=broker) as client,
    ):
        forged = Resolution(
            topic="auto", scorer="bm25", best=Candidate(intent="risk_review", confidence=0.01)
        )
        task = msgspec.structs.replace(client.task("risk_review", {"text": "x"}), resolution=forged)
        await client.submit(task)
        completed = await watcher.event("completed", message_id=task.message_id)
        # One that is no resolution at all is dropped too, not judged: it was dead-lettered
        # as a broken field (an outside trial).
        made_up = client.task("risk_review", {"text": "y"})
        body = msgspec.to_builtins(made_up) | {"resolution": {"x": 1}}
        subject = client.broker.names.task("risk_review", client.caller)
        await client.broker.publish(
            subject, msgspec.json.encode(body), headers=h.task_headers(made_up)
        )
        also = await watcher.event("completed", message_id=made_up.message_id)
    routed = await watcher.event("routed", message_id=task.message_id)
    assert completed.agent_id == "risk-control" and "resolution" not in routed.detail
    assert also.agent_id == "risk-control"


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
