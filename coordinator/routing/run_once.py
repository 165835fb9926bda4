"""Run-once across agents: before a message is dispatched (again), every agent's record of
it is read. A run that finished answers from its stored result instead of running again;
a run still under a live lease is waited for. Each agent writes only its own records, so
this look across them is the coordinator's."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from agentreach.broker import Broker, Bucket
from agentreach.broker.lifecycle import about, emit, event_for, reply
from agentreach.envelopes import Execution, Result, Task, executions_of, now_ms

log = structlog.get_logger("coordinator.run_once")

WAIT_CAP_S = 1.0
REASSIGNED = "reassigned"  # the error a fenced record holds (coordinator.liveness.reassign)


@dataclass(frozen=True, slots=True)
class RanAlready:
    """The message finished on an agent: this is its record (with the result)."""

    record: Execution


@dataclass(frozen=True, slots=True)
class Running:
    """An agent runs the message now, under a lease that ends in ``left_s``."""

    left_s: float


Verdict = RanAlready | Running | None


class RunOnce:
    """Reads the agents' records of a message (one batched read)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._bucket: Bucket[Execution] | None = None

    async def verdict(self, task: Task) -> Verdict:
        """What the records say of ``task``: finished, running elsewhere, or free to run."""
        return verdict_of(await self.records(task))

    async def records(self, task: Task) -> list[Execution]:
        """Every agent's record of ``task``'s message."""
        found = await (await self._records()).matching(executions_of(task.caller, task.message_id))
        return [entry.value for entry in found.values()]

    async def _records(self) -> Bucket[Execution]:
        if self._bucket is None:
            names = self._broker.names
            self._bucket = await self._broker.bucket(names.executions_bucket, Execution)
        return self._bucket


def verdict_of(records: list[Execution]) -> Verdict:
    """Finished (a ``done`` record), running (the longest live lease), or free to run."""
    now = now_ms()
    running = 0
    for record in records:
        if record.state == "done":
            return RanAlready(record)
        if record.state == "running" and record.lease_until_ms > now:
            running = max(running, record.lease_until_ms - now)
    return Running(running / 1000) if running else None


def superseded(
    records: list[Execution], agent_id: str | None, attempt: int, reported_at_ms: int
) -> str | None:
    """Why what ``agent_id`` reported at ``reported_at_ms`` of ``attempt`` no longer counts,
    if it does not: a later attempt was dispatched since; the attempt was taken from the
    agent (it went OFFLINE and the task was reassigned); or a later run of the attempt by the
    same agent (a redelivery that took a stalled run over) failed since, and reports that
    itself (a record is written before its report, on the agent's clock)."""
    for r in records:
        if r.attempt > attempt:
            return f"attempt {r.attempt} was dispatched since"
        if r.agent_id != agent_id or r.attempt != attempt or r.state != "failed":
            continue
        if r.error is not None and r.error.type == REASSIGNED:
            return "the attempt was taken from its agent"
        if r.finished_at_ms > reported_at_ms:
            return "a later run of the attempt failed since, and reports for itself"
    return None


async def answer_from_record(broker: Broker, task: Task, record: Execution) -> None:
    """The message ran already (a republish, a retry or a redelivery after its result was
    recorded): its stored result answers, and nothing runs again."""
    log.info("ran already; answering from its record", agent_id=record.agent_id)
    answer = Result(
        **about(task, from_agent=record.agent_id),
        result=record.result,
        result_ref=record.result_ref,
    )
    await reply(broker, task, answer)
    await emit(broker, event_for(task, "answered_from_record", agent_id=record.agent_id))
