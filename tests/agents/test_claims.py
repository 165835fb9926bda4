"""Run-once claims on a real bucket: the first delivery's claim is written without a read,
and is judged as any other when a record was there after all."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from agentreach.agents import claims as claims_module
from agentreach.agents.claims import (
    AlreadyDone,
    AlreadyFailed,
    Busy,
    Claimed,
    Claims,
    Moved,
    Outcome,
)
from agentreach.broker import BrokerError, Bucket
from agentreach.envelopes import REASSIGNED, ErrorInfo, Execution, Task, execution_key, new_id


def task() -> Task:
    message_id = new_id()
    return Task(v=1, message_id=message_id, trace_id=message_id, topic="echo", caller="alice")


async def claims_of(broker, epoch: int = 1) -> Claims:
    bucket = await broker.bucket(broker.names.executions_bucket, Execution)
    return Claims(bucket, "claimer", epoch)


async def still_working() -> None:
    return None


async def test_a_first_delivery_claims_without_reading(broker):
    claims = await claims_of(broker)
    claim = await claims.claim(task(), lease_ms=5_000, first=True)
    assert isinstance(claim, Claimed) and claim.revision > 0


async def test_a_first_delivery_of_a_message_that_ran_gets_its_result(broker):
    """A republish of the same id reaches the agent as a first delivery: the optimistic
    write loses to the stored record, which is read, and nothing runs twice."""
    claims, same = await claims_of(broker), task()
    claim = await claims.claim(same, lease_ms=5_000)
    assert isinstance(claim, Claimed)
    assert await claims.record(same, Outcome(claim, result={"n": 1}), still_working=still_working)
    again = await claims.claim(same, lease_ms=5_000, first=True)
    assert isinstance(again, AlreadyDone) and again.record.result == {"n": 1}


async def test_an_attempt_that_failed_here_is_not_run_again_but_a_retry_is(broker):
    """A delivery of an attempt recorded failed (its report's ack was lost, the server
    delivered it again) is not run again: AlreadyFailed, its error reported again. The next
    attempt (the coordinator's retry) runs; an older attempt's delivery does not."""
    claims, same = await claims_of(broker), task()
    claim = await claims.claim(same, lease_ms=5_000)
    assert isinstance(claim, Claimed)
    error = ErrorInfo(type="ValueError", message="bad input", retryable=False)
    assert await claims.record(same, Outcome(claim, error=error), still_working=still_working)
    for first in (True, False):
        again = await claims.claim(same, lease_ms=5_000, first=first)
        assert isinstance(again, AlreadyFailed) and again.record.error == error
    retry = msgspec.structs.replace(same, attempt=2)
    retried = await claims.claim(retry, lease_ms=5_000)
    assert isinstance(retried, Claimed)
    assert await claims.record(retry, Outcome(retried, error=error), still_working=still_working)
    assert isinstance(await claims.claim(same, lease_ms=5_000), Moved)  # attempt 1: stale
    # Sent again past the intake's duplicate window after it failed: another life, it runs.
    another_life = msgspec.structs.replace(same, received_ms=same.received_ms + 1)
    assert isinstance(await claims.claim(another_life, lease_ms=5_000), Claimed)


async def test_a_first_delivery_of_a_message_running_elsewhere_is_busy(broker):
    """The same process holds a live lease (another delivery in hand runs it): busy, not
    taken."""
    claims, same = await claims_of(broker), task()
    with claims.in_hand(same.message_id) as running:
        assert isinstance(await claims.claim(same, lease_ms=5_000, hand=running), Claimed)
        with claims.in_hand(same.message_id) as again:
            claim = await claims.claim(same, lease_ms=5_000, first=True, hand=again)
            assert isinstance(claim, Busy)
    later = await claims_of(broker, epoch=2)  # a restarted process takes its own over at once
    assert isinstance(await later.claim(same, lease_ms=5_000, first=True), Claimed)


async def test_a_run_in_hand_keeps_its_claim_past_its_lease(broker):
    """Its lease ran out unrenewed (the server away): a redelivery to this process still
    waits for the run in hand, which goes on; another process would take it over."""
    claims, same = await claims_of(broker), task()
    with claims.in_hand(same.message_id) as running:
        assert isinstance(await claims.claim(same, lease_ms=0, hand=running), Claimed)
        with claims.in_hand(same.message_id) as redelivered:
            assert isinstance(await claims.claim(same, lease_ms=5_000, hand=redelivered), Busy)
        other = await claims_of(broker, epoch=2)
        assert isinstance(await other.claim(same, lease_ms=5_000), Claimed)


async def test_a_claim_of_this_process_no_delivery_in_hand_holds_is_taken_over(broker):
    """The claim's write landed but its delivery gave up (the answer was lost): the next
    delivery takes it over at once. Another process of the agent (a higher epoch) is waited
    for, as is an outcome of this process still to be recorded."""
    claims, same = await claims_of(broker), task()
    with claims.in_hand(same.message_id) as gave_up:
        lost = await claims.claim(same, lease_ms=60_000, hand=gave_up)
    assert isinstance(lost, Claimed)
    with claims.in_hand(same.message_id) as redelivered:
        again = await claims.claim(same, lease_ms=60_000, hand=redelivered)
    assert isinstance(again, Claimed) and again.revision > lost.revision
    earlier = await claims_of(broker, epoch=0)  # the record is a later process's
    with earlier.in_hand(same.message_id):
        assert isinstance(await earlier.claim(same, lease_ms=5_000), Busy)


async def test_an_outcome_waiting_to_be_recorded_holds_the_claim(broker, monkeypatch):
    """A run's outcome that could not be recorded yet keeps its claim from being taken over:
    the redelivery answers from the outcome, it does not run the message again."""
    monkeypatch.setattr(claims_module, "RECORD_TRIES", 1)
    bucket = await broker.bucket(broker.names.executions_bucket, Execution)
    claims, same = Claims(_FailingUpdates(bucket), "claimer", 1), task()
    claim = await claims.claim(same, lease_ms=60_000)
    assert isinstance(claim, Claimed)
    with pytest.raises(BrokerError):
        await claims.record(same, Outcome(claim, result=1), still_working=still_working)
    assert claims.unrecorded(same.message_id) is not None
    with claims.in_hand(same.message_id):
        assert isinstance(await claims.claim(same, lease_ms=60_000), Busy)


async def test_a_delivery_waiting_on_a_run_whose_outcome_could_not_be_recorded_answers_from_it(
    broker, monkeypatch
):
    """Delivery B waits (busy) while delivery A of this process runs; A's outcome cannot be
    recorded (the broker failing past every try) and is kept: B answers from it instead of
    waiting out A's lease and running the message a second time."""
    monkeypatch.setattr(claims_module, "RECORD_TRIES", 1)
    bucket = await broker.bucket(broker.names.executions_bucket, Execution)
    claims, same = Claims(_FailingUpdates(bucket), "claimer", 1), task()
    with claims.in_hand(same.message_id) as first:
        a = await claims.claim(same, lease_ms=60_000, hand=first)
        assert isinstance(a, Claimed)
        with claims.in_hand(same.message_id) as second:
            b = asyncio.create_task(
                claims.claim_when_free(
                    same, lease_ms=60_000, still_working=still_working, hand=second
                )
            )
            outcome = Outcome(a, result={"ran": "once"})
            with pytest.raises(BrokerError):
                await claims.record(same, outcome, still_working=still_working)
            answer = await asyncio.wait_for(b, 5)
    assert answer is outcome


class _FailingUpdates:
    """The bucket, except that writing an outcome fails (the server restarting)."""

    def __init__(self, bucket: Bucket[Execution]) -> None:
        self._bucket = bucket

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bucket, name)

    async def update(self, *args: Any, **kwargs: Any) -> int:
        raise BrokerError("the server is restarting")


async def test_a_process_that_takes_a_crashed_run_over_keeps_when_it_began(broker):
    """The run's start travels with the claim: a restarted process (a higher epoch) that
    takes the attempt over is told when the crashed run began (its budget counts from
    there); a new attempt, or the first claim, starts afresh."""
    crashed, same = await claims_of(broker), task()
    first = await crashed.claim(same, lease_ms=60_000, first=True)
    assert isinstance(first, Claimed) and not first.resumed and first.started_ms > 0
    await asyncio.sleep(0.05)  # the restart comes later (a clock that moves)
    restarted = await claims_of(broker, epoch=2)
    taken = await restarted.claim(same, lease_ms=60_000)
    assert isinstance(taken, Claimed) and taken.resumed
    assert taken.started_ms == first.started_ms
    assert await restarted.renew(same, taken, lease_ms=120_000)
    again = await claims_of(broker, epoch=3)
    retaken = await again.claim(same, lease_ms=60_000)
    assert isinstance(retaken, Claimed) and retaken.started_ms == first.started_ms
    next_attempt = await claims_of(broker, epoch=4)
    fresh = await next_attempt.claim(msgspec.structs.replace(same, attempt=2), lease_ms=1_000)
    assert isinstance(fresh, Claimed) and not fresh.resumed


async def test_a_renewal_that_landed_late_leaves_the_claim_this_run_s(broker):
    """A renewal that timed out while the server was away lands after the reconnect (the
    client's reconnect buffer), moving the record's revision: the next renewal and the
    outcome are still written (the outcome was refused as fenced, the result dropped, and
    the redelivery ran the handler a second time). A record of another process's stays a
    fence."""
    claims, same = await claims_of(broker), task()
    bucket = await broker.bucket(broker.names.executions_bucket, Execution)
    key = f"{same.caller}.{same.message_id}.claimer"
    claim = await claims.claim(same, lease_ms=5_000)
    assert isinstance(claim, Claimed)
    landed = msgspec.structs.replace((await bucket.get(key)).value, lease_until_ms=1)
    await bucket.put(key, landed)
    assert await claims.renew(same, claim, lease_ms=20_000)
    await bucket.put(key, landed)
    assert await claims.record(same, Outcome(claim, result={"n": 1}), still_working=still_working)
    done = (await bucket.get(key)).value
    assert done.state == "done"
    # The outcome says when its run began: a completion said from it has its duration.
    assert 0 < done.started_ms == claim.started_ms <= done.finished_at_ms

    other, taken = await claims_of(broker), task()
    claim = await other.claim(taken, lease_ms=5_000)
    assert isinstance(claim, Claimed)
    takeover = f"{taken.caller}.{taken.message_id}.claimer"
    await bucket.put(takeover, msgspec.structs.replace((await bucket.get(takeover)).value, epoch=2))
    assert not await other.renew(taken, claim, lease_ms=20_000)
    assert not await other.record(taken, Outcome(claim, result=2), still_working=still_working)


@pytest.mark.parametrize("first", [True, False])
async def test_an_attempt_older_than_the_fence_of_a_later_one_is_not_run(broker, first: bool):
    """The agent's one record of a message keeps the last reassignment fence: the fence of
    attempt 3 replaced that of attempt 2, and a process of the agent that came back and
    fetched attempt 2 from its queue ran it beside attempt 3 (a cluster walkthrough: 17 tasks
    completed on two agents). A fence fences off its attempt and every earlier one."""
    claims, stale = await claims_of(broker, epoch=2), task()
    fence = Execution(
        message_id=stale.message_id, state="failed", agent_id="claimer", epoch=1, attempt=3,
        error=ErrorInfo(type=REASSIGNED, message="its agent went OFFLINE", retryable=True),
    )  # fmt: skip
    bucket = await broker.bucket(broker.names.executions_bucket, Execution)
    await bucket.put(execution_key("alice", stale.message_id, "claimer"), fence)
    for attempt in (2, 3):
        claim = await claims.claim(
            msgspec.structs.replace(stale, attempt=attempt), lease_ms=5_000, first=first
        )
        assert isinstance(claim, Moved), (attempt, claim)
    later = await claims.claim(msgspec.structs.replace(stale, attempt=4), lease_ms=5_000)
    assert isinstance(later, Claimed)  # the next attempt may run here
