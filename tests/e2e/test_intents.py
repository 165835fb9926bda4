"""Intent resolution end to end: free text on reach.task.auto reaches the agent whose
description it matches, with its confidence recorded; unsure requests wait for a person."""

from __future__ import annotations

import msgspec

from agentreach.agents import ManualReview, ManualReviewError, ReachClient
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
    assert item.message_id == blank and item.reason == (
        "no intent found for rule 'fallback': no text to resolve at payload.body.text"
    )
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
