"""An agent's reports of one attempt, on a real server: a run of the attempt again (its
dispatch delivered again after a server restart) reports with the first run's Nats-Msg-Id,
so the stream keeps one report, which must decide the attempt."""

from __future__ import annotations

import msgspec

from agentreach.agents import Agent, TaskContext
from agentreach.broker.lifecycle import emit, event_for, event_message
from agentreach.envelopes import ErrorInfo, Execution, Task, execution_key, now_ms
from tests.coordinator.observability.test_metrics import replica
from tests.support import Watcher, eventually


def _steady(agent_id: str) -> Agent:
    """An agent whose `flaky` handler succeeds, saying which attempt it ran."""
    steady = Agent(agent_id, startup_delay=0)

    @steady.handler("flaky")
    async def flaky(ctx: TaskContext, payload: dict) -> dict:
        return {"attempt": ctx.attempt}

    return steady


def _flaky_task(message_id: str, *, received_ms: int, ttl_ms: int = 60_000) -> Task:
    return Task(
        v=1,
        message_id=message_id,
        trace_id=message_id,
        topic="flaky",
        caller="c1",
        ttl_ms=ttl_ms,
        received_ms=received_ms,
        payload={},
    )


async def test_an_attempt_run_twice_that_failed_twice_is_retried(broker, watcher: Watcher):
    """Attempt 1 failed on `a-1`, ran again there and failed again: the second run's record
    is written, its report dropped as the first's duplicate. The first report stands for
    both, and attempt 2 runs (it was left alone, "a later run … reports for itself", and the
    task stayed at `retry_scheduled` for good: no retry, no letter)."""
    steady = _steady("steady-1")

    task = _flaky_task("ran-twice-1", received_ms=now_ms())
    error = ErrorInfo(type="deadline_exceeded", message="ran past 3000 ms", retryable=True)
    async with replica(broker), steady.running(broker=broker):
        await emit(broker, event_for(task, "routed", agent_id="a-1"))
        first = event_for(task, "failed", agent_id="a-1", task=task, error=error)
        again = msgspec.structs.replace(first, at_ms=first.at_ms + 2_001)
        records = await broker.bucket(broker.names.executions_bucket, Execution)
        await records.put(
            execution_key("c1", task.message_id, "a-1"),
            Execution(
                message_id=task.message_id,
                state="failed",
                agent_id="a-1",
                attempt=1,
                finished_at_ms=again.at_ms - 1,
                error=error,
                caller="c1",
            ),
        )
        await emit(broker, first, sender="a-1")
        subject, data, headers = event_message(broker, again, sender="a-1")
        assert (await broker.publish(subject, data, headers=headers)).duplicate
        scheduled = await watcher.event("retry_scheduled", message_id=task.message_id)
        done = await watcher.event("completed", message_id=task.message_id)
    assert scheduled.detail["next_attempt"] == 2
    assert (done.attempt, done.agent_id, done.detail["result"]) == (2, "steady-1", {"attempt": 2})


async def test_a_message_sent_again_after_it_ended_is_retried_past_its_earlier_records(
    broker, watcher: Watcher
):
    """Its earlier life ended at attempt 3 on `b-1` (retries exhausted); sent again past the
    duplicate window, its attempt 1 fails on `a-1`: retried, and completed by attempt 2. It
    was left alone ("attempt 3 was dispatched since"), with no retry and no letter."""
    steady = _steady("steady-2")

    now = now_ms()
    task = _flaky_task("again-life-1", received_ms=now - 1_000)
    error = ErrorInfo(type="upstream_down", message="503", retryable=True)
    async with replica(broker), steady.running(broker=broker):
        records = await broker.bucket(broker.names.executions_bucket, Execution)
        await records.put(
            execution_key("c1", task.message_id, "b-1"),
            Execution(
                message_id=task.message_id,
                state="failed",
                agent_id="b-1",
                attempt=3,
                finished_at_ms=now - 150_000,
                error=error,
                caller="c1",
            ),
        )
        await emit(broker, event_for(task, "routed", agent_id="a-1"))
        failed = event_for(task, "failed", agent_id="a-1", task=task, error=error)
        await emit(broker, failed, sender="a-1")
        done = await watcher.event("completed", message_id=task.message_id)
    assert (done.attempt, done.agent_id) == (2, "steady-2")


async def test_a_report_of_a_later_life_of_the_message_id_is_not_an_earlier_one_s_copy(
    broker, watcher: Watcher
):
    """The message id sent again past the intake's duplicate window is a new life (a new
    `received_ms`): its attempt 1 failing on the agent where the earlier life's attempt 1
    failed, while that report is still in the events' duplicate window, is stored, retried
    and completed. Its Nats-Msg-Id was the earlier report's: dropped, no retry, no letter."""
    steady = _steady("steady-3")

    now = now_ms()
    earlier = _flaky_task("two-lives-1", received_ms=now - 125_000, ttl_ms=600_000)
    later = msgspec.structs.replace(earlier, received_ms=now - 1_000)
    # The earlier life ends at its attempt 1 (a run of it now would be a record of this life's
    # time, which supersedes the later life's attempt 1).
    ended = ErrorInfo(type="bad_input", message="no such upstream", retryable=False)
    error = ErrorInfo(type="upstream_down", message="503", retryable=True)
    async with replica(broker), steady.running(broker=broker):
        for life, why in ((earlier, ended), (later, error)):
            await emit(broker, event_for(life, "routed", agent_id="a-1"))
            failed = event_for(life, "failed", agent_id="a-1", task=life, error=why)
            subject, data, headers = event_message(broker, failed, sender="a-1")
            assert not (await broker.publish(subject, data, headers=headers)).duplicate

        def completed_later() -> bool:
            return any(
                e.event == "completed" and e.received_ms == later.received_ms
                for e in watcher.events
            )

        await eventually(completed_later, timeout=15)


async def test_a_broken_report_ends_only_the_message_of_the_caller_its_attempt_was_for(
    broker, watcher: Watcher
):
    """mallory had her own task under alice's message id routed to herself, then reported it
    `failed` with a broken task and `caller: "alice"` in the body: alice's task, waiting for
    bob, was dead-lettered in alice's name. The caller is the routing's: her report is
    refused as an impersonation, and one naming no caller ends her own message."""
    alice = _flaky_task("collide-1", received_ms=now_ms())
    alice = msgspec.structs.replace(alice, caller="alice")
    own = msgspec.structs.replace(alice, caller="mallory", topic="mtopic")
    error = {"type": "x", "message": "y", "retryable": False}
    async with replica(broker):
        await emit(broker, event_for(alice, "routed", agent_id="bob"))
        for attempt in (1, 2):
            routed = msgspec.structs.replace(own, attempt=attempt)
            await emit(broker, event_for(routed, "routed", agent_id="mallory"))
        for attempt, caller in ((1, "alice"), (2, None)):
            run = msgspec.structs.replace(own, attempt=attempt)
            broken = event_for(run, "failed", agent_id="mallory", task="broken", error=error)
            said = msgspec.structs.replace(broken, caller=caller)
            await emit(broker, said, sender="mallory")
        letter = await watcher.dead_letter("invalid_envelope", message_id=own.message_id)
        await eventually(lambda: _impersonations(watcher) == ["mallory"], timeout=15)
    assert letter.envelope is not None and letter.envelope.caller == "mallory"
    assert [d.envelope.caller for d in watcher.dead_letters if d.envelope] == ["mallory"]


def _impersonations(watcher: Watcher) -> list[str | None]:
    return [
        e.agent_id
        for e in watcher.events
        if e.event == "alert" and e.detail.get("problem") == "impersonation"
    ]
