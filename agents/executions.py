"""Exactly-once effect on top of at-least-once delivery: claim a message before running it.

The claim is a create-if-absent in the shared ``reach_executions`` bucket, so two
deliveries of one message_id (a redelivery, a republish, a retry on another
agent) cannot both run it. A claim is a lease: if its holder dies, the message
runs again once the lease has passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from agentreach.broker.errors import translate
from agentreach.envelopes import ErrorInfo, Execution, Task
from nats.js.kv import KeyValue

from agentreach import envelopes

_decoder = msgspec.json.Decoder(Execution)


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


class ExecutionRecords:
    """Claims and outcomes of messages, shared by every agent."""

    def __init__(self, kv: KeyValue, agent_id: str, epoch: int) -> None:
        self._kv = kv
        self._agent_id = agent_id
        self._epoch = epoch

    async def claim(self, task: Task, lease_ms: int) -> Claim:
        """Take the right to run ``task``, unless it ran already or runs elsewhere."""
        record = self._record(task, "running", lease_until_ms=_now_ms() + lease_ms)
        try:
            return Claimed(await self._kv.create(task.message_id, envelopes.encode(record)))
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # someone has a record already: read it below
        except nats.errors.Error as exc:
            raise translate(exc) from exc
        return await self._contend(task, record)

    async def finish(self, task: Task, claim: Claimed, result: Any) -> bool:
        """Keep the result for any later delivery; False when the claim was taken away
        (the task was reassigned meanwhile) and this result must not be used."""
        return await self._write(task, claim, self._record(task, "done", result=result))

    async def fail(self, task: Task, claim: Claimed, error: ErrorInfo) -> None:
        """Release the claim so that a retry of the message may run it."""
        await self._write(task, claim, self._record(task, "failed", error=error))

    async def _contend(self, task: Task, record: Execution) -> Claim:
        try:
            entry = await self._kv.get(task.message_id)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return Busy(retry_in_s=0.1)  # vanished between create and get: just try again
        except nats.errors.Error as exc:
            raise translate(exc) from exc
        try:
            current = _decoder.decode(entry.value or b"")
        except msgspec.DecodeError:
            current = None  # an unreadable record must not block the message forever
        if current is not None and current.state == "done":
            return AlreadyDone(current)
        if current is not None and current.state == "running" and not self._outlived(current):
            left_ms = current.lease_until_ms - _now_ms()
            if left_ms > 0:
                return Busy(retry_in_s=left_ms / 1000)
        try:
            revision = await self._kv.update(
                task.message_id, envelopes.encode(record), last=entry.revision
            )
        except nats.js.errors.KeyWrongLastSequenceError:
            return Busy(retry_in_s=0.1)  # lost the race for the lapsed lease
        except nats.errors.Error as exc:
            raise translate(exc) from exc
        return Claimed(revision)

    def _outlived(self, record: Execution) -> bool:
        """The holder was an earlier process of this agent: it is gone, its lease with it."""
        return record.agent_id == self._agent_id and record.epoch < self._epoch

    async def _write(self, task: Task, claim: Claimed, record: Execution) -> bool:
        try:
            await self._kv.update(task.message_id, envelopes.encode(record), last=claim.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            # Our lease lapsed or the task was reassigned; the other outcome stands.
            return False
        except nats.errors.Error as exc:
            raise translate(exc) from exc
        return True

    def _record(self, task: Task, state: str, **fields: Any) -> Execution:
        return Execution(
            message_id=task.message_id,
            state=state,  # type: ignore[arg-type]
            agent_id=self._agent_id,
            epoch=self._epoch,
            attempt=task.attempt,
            finished_at_ms=_now_ms() if state != "running" else 0,
            **fields,
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
