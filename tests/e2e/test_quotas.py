"""Callers' quotas through a real server: refused at intake as rate_limited, held across
coordinator replicas, one caller's quota leaving the others alone; a refusal is a dead letter
only when its caller would hear it from nobody else, and a flood cannot fill the DLQ."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import ReachClient, Rejected
from agentreach.broker import Broker
from agentreach.coordinator import IntakeConfig, RateLimits
from agentreach.envelopes import QuotaRecord, RateLimit, Task, new_id, now_ms
from agentreach.envelopes.headers import task_headers
from tests.e2e.routing_support import fast, publish_many, serving, worker
from tests.support import Watcher, eventually


def refused(watcher: Watcher, ids: set[str]) -> list[envelopes.Event]:
    return [e for e in watcher.events if e.event == "rejected" and e.message_id in ids]


async def operator_task(broker: Broker, *, caller: str) -> str:
    """An operator's task on the bare ``reach.task.work``, its body claiming ``caller``."""
    message_id = new_id()
    task = Task(v=1, message_id=message_id, trace_id=message_id, topic="work", caller=caller)
    subject = broker.names.task("work")
    await broker.publish(subject, envelopes.encode(task), headers=task_headers(task))
    return message_id


async def test_a_caller_over_its_quota_is_refused_as_rate_limited(
    broker, start_coordinator, watcher
):
    """Past its burst a caller's invoke raises Rejected: rate_limited, retryable, with a
    hint of when to retry; a `rejected` event names the caller and its quota, and nothing
    is dead-lettered."""
    counts: Counter[str] = Counter()
    limits = RateLimits(callers={"alice": RateLimit(rate=0.2, burst=2)})
    async with (
        start_coordinator(fast(rate_limits=limits)) as coordinator,
        serving(broker, coordinator, worker("w", counts)),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        for i in range(2):
            assert await alice.invoke("work", {"i": i}) == {"by": "w"}
        with pytest.raises(Rejected) as caught:
            await alice.invoke("work", {"i": 2})
        event = await watcher.event("rejected", message_id=caught.value.message_id)
    error = caught.value.error
    assert caught.value.reason == "rate_limited" and error.retryable
    assert caught.value.attempts == 0  # none began
    assert error.retry_after_ms is not None and 0 < error.retry_after_ms <= 5_000
    assert "caller 'alice' is over its quota 'alice' (0.2/s, burst 2)" in error.message
    assert event.detail["caller"] == "alice"
    assert event.detail["quota"] == {"name": "alice", "rate": 0.2, "burst": 2}
    assert event.detail["error"]["type"] == "rate_limited"
    assert counts["w"] == 2
    assert watcher.count("dead_lettered") == 0 and watcher.dead_letters == []


async def test_three_replicas_hold_one_quota_per_caller(broker, start_coordinator, watcher):
    """Three coordinators together admit no more of alice's flood than burst + rate *
    elapsed (and no fewer than its refills), one write of her shared record each; the rest
    is refused at intake. Bob (no quota) and an operator's bare task
    claiming alice are not limited."""
    counts: Counter[str] = Counter()
    limits = RateLimits(callers={"alice": RateLimit(rate=4, burst=5)})
    config = fast(rate_limits=limits, intake=IntakeConfig(batch=4))
    async with (
        start_coordinator(config) as one,
        start_coordinator(config) as two,
        start_coordinator(config) as three,
        worker("w", counts).running(broker=broker),
        ReachClient(broker=broker, name="alice") as alice,
        ReachClient(broker=broker, name="bob") as bob,
    ):
        replicas = (one, two, three)
        await eventually(lambda: all("w" in c.directory.cards for c in replicas))
        start_ms = now_ms()
        flood: set[str] = set()
        for _ in range(4):  # 60 tasks in waves over about 1.2 s: far beyond the rate
            flood |= await publish_many(alice, "work", 15)
            await asyncio.sleep(0.4)
        free = await publish_many(bob, "work", 30)
        operator = {await operator_task(broker, caller="alice") for _ in range(5)}

        def settled() -> bool | None:
            done = watcher.count("completed", flood) + len(refused(watcher, flood)) == 60
            others = watcher.count("completed", free | operator) == 35
            return (done and others) or None

        await watcher.until(settled, "every task completed or refused", timeout=60)
    admitted = 60 - len(refused(watcher, flood))
    records = await broker.bucket(broker.names.quotas_bucket, QuotaRecord)
    record = await records.get("alice")
    assert record is not None
    window_s = (record.value.at_ms - start_ms) / 1000  # first publish → last admission
    assert 5 + 4 <= admitted <= 5 + 4 * window_s + 1e-9, (admitted, window_s)
    assert record.revision == admitted  # one write per admission, whichever replica
    assert sum(c.quotas.admitted for c in replicas) == admitted
    assert sum(c.quotas.refused for c in replicas) == 60 - admitted
    assert sum(1 for c in replicas if c.quotas.admitted + c.quotas.refused) >= 2
    assert {e.detail["caller"] for e in refused(watcher, flood)} == {"alice"}
    assert refused(watcher, free | operator) == []
    assert counts["w"] == admitted + 35
    # Published without a reply address: refusals nobody hears are dead-lettered, at most
    # at the quota's own pace per replica (5 + 4/s each here), the rest are events alone.
    letters = await watcher.until(lambda: watcher.dead_letters or None, "a dead letter")
    assert {d.message_id for d in letters} <= {e.message_id for e in refused(watcher, flood)}
    assert {(d.reason, d.error.type if d.error else None) for d in letters} == {
        ("rejected", "rate_limited")
    }


async def test_a_caller_over_its_quota_cannot_flood_the_dlq_with_malformed_bodies(
    broker, start_coordinator, watcher
):
    """A malformed body is charged to its caller's quota as a task is: within it, each one is
    dead-lettered as invalid_envelope (with its reason); past it, refused as rate_limited
    with a `rejected` event and no dead letter."""
    limits = RateLimits(callers={"mallet": RateLimit(rate=0.2, burst=3)})
    subject = broker.names.task("work", "mallet")
    async with start_coordinator(fast(rate_limits=limits)):
        ids = [f"junk-{n}" for n in range(8)]
        for message_id in ids:
            await broker.publish(subject, b"{not json", headers={"Nats-Msg-Id": message_id})
        await eventually(lambda: len(watcher.dead_letters) + len(refused(watcher, set(ids))) == 8)
    assert [d.reason for d in watcher.dead_letters] == ["invalid_envelope"] * 3
    assert {d.message_id for d in watcher.dead_letters} == set(ids[:3])
    rejected = refused(watcher, set(ids))
    assert len(rejected) == 5
    assert {e.detail["error"]["type"] for e in rejected} == {"rate_limited"}
    assert {e.detail["caller"] for e in rejected} == {"mallet"}


async def test_a_refusal_nobody_would_hear_is_a_dead_letter_at_the_quotas_pace(
    broker, start_coordinator, watcher
):
    """Fire and forget past the quota (no reply address): the refused tasks were lost
    without a word to their sender (`reach publish --count` said all were published). Each
    is dead-lettered as rejected / rate_limited, up to the quota's own pace; a flood past
    that is `rejected` events alone, and the coordinator says so once."""
    limits = RateLimits(callers={"firehose": RateLimit(rate=0.2, burst=3)})
    async with (
        start_coordinator(fast(rate_limits=limits)) as coordinator,
        serving(broker, coordinator, worker("w", Counter())),
        ReachClient(broker=broker, name="firehose") as firehose,
    ):
        with capture_logs() as logs:
            ids = [await firehose.publish("work", {"i": i}) for i in range(9)]
            sent = {message_id for message_id, _ in ids}
            await eventually(lambda: len(refused(watcher, sent)) == 6)
            await eventually(lambda: len(watcher.dead_letters) == 3)
    letters = watcher.dead_letters
    assert {d.message_id for d in letters} <= {e.message_id for e in refused(watcher, sent)}
    assert {d.reason for d in letters} == {"rejected"}
    assert all(d.error is not None and d.error.type == "rate_limited" for d in letters)
    assert all(d.envelope is not None and d.envelope.caller == "firehose" for d in letters)
    flooding = [line for line in logs if "floods past its quota" in line["event"]]
    assert len(flooding) == 1 and flooding[0]["caller"] == "firehose", flooding
