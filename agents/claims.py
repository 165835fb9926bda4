"""Exactly-once effect on top of at-least-once delivery: claim a message before running it.

The claim is a conditional write in the shared ``reach_executions`` bucket, so two
deliveries of one message_id (a redelivery, a republish, a retry on another
agent) cannot both run it. A claim is a lease: if its holder dies, the message
runs again once the lease has passed; a lease held by an earlier process of the
same agent (a lower epoch) is taken over at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentreach.broker import Bucket, WrongLastSequence
from agentreach.envelopes import ErrorInfo, Execution, Task, now_ms


@dataclass(frozen=True, slots=True)
class Claimed:
    """This delivery runs the message; ``revision`` guards the record's next write."""

    revision: int


@dataclass(frozen=True, slots=True)
class AlreadyDone:
    """The message ran before; here is what it returned."""

    record: Execution


@dataclass(frozen=True, slots=True)
class Busy:
    """Another delivery holds the lease; try again after ``retry_in_s``."""

    retry_in_s: float


Claim = Claimed | AlreadyDone | Busy


class Claims:
    """This agent's claims and outcomes of messages, in a bucket shared by every agent."""

    def __init__(self, bucket: Bucket[Execution], agent_id: str, epoch: int) -> None:
        self._bucket = bucket
        self._agent_id = agent_id
        self._epoch = epoch

    async def claim(self, task: Task, lease_ms: int) -> Claim:
        """Take the right to run ``task``, unless it ran already or runs elsewhere."""
        mine = self._record(task, "running", lease_until_ms=now_ms() + lease_ms)
        swap = await self._bucket.cas(task.message_id, lambda held: self._take(held, mine))
        if swap.written:
            assert swap.entry is not None
            return Claimed(swap.entry.revision)
        held = swap.entry.value if swap.entry else None
        if held is not None and held.state == "done":
            return AlreadyDone(held)
        left_ms = held.lease_until_ms - now_ms() if held else 0
        return Busy(retry_in_s=max(left_ms, 100) / 1000)

    async def finish(self, task: Task, claim: Claimed, result: Any) -> bool:
        """Keep the result for any later delivery; False when the claim was taken away
        (the task was reassigned meanwhile) and this result must not be used."""
        return await self._write(task, claim, self._record(task, "done", result=result))

    async def fail(self, task: Task, claim: Claimed, error: ErrorInfo) -> None:
        """Release the claim so that a retry of the message may run it."""
        await self._write(task, claim, self._record(task, "failed", error=error))

    def _take(self, held: Execution | None, mine: Execution) -> Execution | None:
        """``mine`` when the message is free to run here; None when it ran or runs elsewhere."""
        if held is None or held.state == "failed":
            return mine  # an unreadable record must not block the message forever
        if held.state == "done":
            return None
        outlived = held.agent_id == self._agent_id and held.epoch < self._epoch
        if outlived or held.lease_until_ms <= now_ms():
            return mine  # its holder is gone: an earlier process of ours, or a lapsed lease
        return None

    async def _write(self, task: Task, claim: Claimed, record: Execution) -> bool:
        try:
            await self._bucket.update(task.message_id, record, last=claim.revision)
        except WrongLastSequence:
            return False  # our lease lapsed or the task was reassigned; the other outcome stands
        return True

    def _record(
        self, task: Task, state: Literal["running", "done", "failed"], **fields: Any
    ) -> Execution:
        return Execution(
            message_id=task.message_id,
            state=state,
            agent_id=self._agent_id,
            epoch=self._epoch,
            attempt=task.attempt,
            finished_at_ms=now_ms() if state != "running" else 0,
            **fields,
        )
