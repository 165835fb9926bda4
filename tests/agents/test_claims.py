"""Run-once claims on a real bucket: the first delivery's claim is written without a read,
and is judged as any other when a record was there after all."""

from __future__ import annotations

from agentreach.agents.claims import AlreadyDone, Busy, Claimed, Claims, Outcome
from agentreach.envelopes import Execution, Task, new_id


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


async def test_a_first_delivery_of_a_message_running_elsewhere_is_busy(broker):
    """The same process holds a live lease (another delivery runs it): busy, not taken."""
    claims, same = await claims_of(broker), task()
    assert isinstance(await claims.claim(same, lease_ms=5_000), Claimed)
    assert isinstance(await claims.claim(same, lease_ms=5_000, first=True), Busy)
    later = await claims_of(broker, epoch=2)  # a restarted process takes its own over at once
    assert isinstance(await later.claim(same, lease_ms=5_000, first=True), Claimed)
