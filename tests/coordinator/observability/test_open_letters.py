"""The open dead letters' gauges: what a compensation worker left undone, and for how long."""

from __future__ import annotations

import pytest

from agentreach.agents.letters import replay, resolve
from agentreach.coordinator.observability import state
from agentreach.envelopes import DeadLetter, Task, encode, new_id, now_ms
from tests.coordinator.observability.test_metrics import replica
from tests.scrape import scrape, total
from tests.support import letter_of, until_true

# What a dead letter carries at least (the coordinator's have their Nats-Msg-Id): one with
# no headers is taken for a direct get's answer asking for none.
LETTERED = {"Reach-Trace-Id": "letter"}


@pytest.fixture(autouse=True)
def sample_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "SAMPLE_S", 0.1)


def task(topic: str) -> Task:
    message_id = new_id()
    return Task(v=1, message_id=message_id, trace_id=message_id, topic=topic, payload={})


async def test_open_letters_count_until_replayed_or_resolved(broker):
    """Three letters stored: three open, by reason, and the oldest one's age; a replay and a
    resolution close two (the replay may leave a letter of its own); a workflow step's
    letter its workflow handles is never open."""
    async with replica(broker) as coordinator:
        stuck = [await letter_of(broker, task("refund"), "retries_exhausted") for _ in range(2)]
        await letter_of(broker, task("lookup"), "no_route")
        step = Task(
            v=1,
            message_id="wf-1-draft-1",
            trace_id="wf-1",
            topic="draft",
            reply_to=broker.names.workflow_reply("wf-1"),
        )
        assert (await letter_of(broker, step, "retries_exhausted")).workflow.handled

        async def open_counts(expected: dict[str, float]) -> dict | None:
            found = await scrape(coordinator.metrics_url)
            counts = {r: total(found, "reach_dlq_open", reason=r) for r in expected}
            return found if counts == expected else None

        async def all_counted() -> dict | None:
            # The open letters and the stored ones are read apart: one scrape may come between.
            found = await open_counts({"retries_exhausted": 2, "no_route": 1})
            stored = found and total(found, "reach_dlq_messages", reason="retries_exhausted")
            return found if stored == 2 + 1 else None

        found = await until_true(all_counted)
        assert 0 < total(found, "reach_dlq_oldest_open_seconds") < 60

        await replay(broker, stuck[0])
        await resolve(broker, stuck[1], "refunded by hand", by="person:ann")
        # The replay ran into no agent: a letter of its own, open.
        await until_true(lambda: open_counts({"retries_exhausted": 0, "no_route": 2}))


async def test_reasons_the_protocol_does_not_name_past_the_ten_most_frequent_are_other(broker):
    """The reason label came from REACH_DLQ's subjects, where anyone can have the server
    store a message (a direct get's answer): 100,000 made-up reasons made 200,000 series
    (security re-test). A routing rule's own reason (`maintenance`) was `other` too (an
    outside operator trial): the ten reasons the protocol does not name with the most
    letters are labels, the rest `other`."""
    async with replica(broker) as coordinator:
        await letter_of(broker, task("lookup"), "no_route")
        for n in range(3):
            await letter_of(broker, task(f"shout-{n}"), "maintenance")
        for n in range(12):  # r0, r1, r10, r11, r2 … r6 named; r7, r8, r9 not
            made_up = broker.names.dlq(f"r{n}", "x")
            await broker.publish(made_up, encode(task("x")), headers=LETTERED)

        async def counted() -> dict | None:
            found = await scrape(coordinator.metrics_url)
            return found if total(found, "reach_dlq_messages", reason="other") == 3 else None

        found = await until_true(counted)
    reasons = {dict(labels)["reason"] for name, labels in found if name == "reach_dlq_messages"}
    named = {"r0", "r1", "r10", "r11", "r2", "r3", "r4", "r5", "r6"}
    assert reasons == {"no_route", "maintenance", "other", *named}
    assert total(found, "reach_dlq_messages", reason="maintenance") == 3
    assert total(found, "reach_dlq_open", reason="maintenance") == 3
    opened = {dict(labels)["reason"] for name, labels in found if name == "reach_dlq_open"}
    assert opened <= reasons


async def test_no_open_letter_reads_zero_age(broker):
    """An empty DLQ: no open letter, an age of 0 (a rule on the age never fires on nothing)."""
    async with replica(broker) as coordinator:

        async def sampled() -> dict | None:
            found = await scrape(coordinator.metrics_url)
            return found if ("reach_dlq_oldest_open_seconds", ()) in found else None

        found = await until_true(sampled)
    assert total(found, "reach_dlq_oldest_open_seconds") == 0
    assert total(found, "reach_dlq_open") == 0


async def test_each_life_of_a_message_id_has_an_open_letter_of_its_own(broker):
    """An id dead-lettered again (a later life, or a second ending) has two letters, as
    `reach dlq list --open` counts them: two open; resolving the first leaves the second."""
    lives = [
        DeadLetter(
            v=1, reason="expired", message_id="twice-1", trace_id="twice-1", topic="slow", at_ms=at
        )
        for at in (now_ms() - 2_000, now_ms() - 1_000)
    ]
    async with replica(broker) as coordinator:
        for letter in lives:
            await broker.publish(
                broker.names.dlq("expired", "slow"), encode(letter), headers=LETTERED
            )

        async def open_expired(expected: float) -> bool:
            found = await scrape(coordinator.metrics_url)
            return total(found, "reach_dlq_open", reason="expired") == expected

        await until_true(lambda: open_expired(2))
        await resolve(broker, lives[0], "the first life's, dealt with", by="person:ann")
        await until_true(lambda: open_expired(1))
