"""A handler in a worker thread cannot be stopped at its deadline: its task never runs twice
at once. Its outcome waits for it, with its slot, its delivery and its claim kept meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.agents.handlers import OVERRUN
from agentreach.envelopes import Execution, execution_key, now_ms
from agentreach.envelopes.described import described


class Runs:
    """When each attempt of a handler ran, on the monotonic clock."""

    def __init__(self) -> None:
        self.spans: dict[int, list[float]] = {}
        self.started = threading.Event()
        self._lock = threading.Lock()

    def start(self, attempt: int) -> None:
        with self._lock:
            self.spans[attempt] = [time.monotonic()]
        self.started.set()

    def end(self, attempt: int) -> None:
        with self._lock:
            self.spans[attempt].append(time.monotonic())


async def test_a_thread_past_its_deadline_runs_once_and_its_late_result_completes(
    broker, coordinator, watcher
):
    """deadline_ms 300, work of 2 s, ack wait 1 s: no retry starts beside it (no failure is
    reported while it runs), its claim stays live past deadline and grace, its delivery is
    not handed out again, and its late result is recorded and answers the caller."""
    agent = Agent("thread-1", startup_delay=0, ack_wait=1.0)
    runs = Runs()

    @agent.handler("sync_slow", deadline_ms=300, max_attempts=2)
    def sync_slow(ctx: TaskContext, payload: dict) -> dict:
        runs.start(ctx.attempt)
        time.sleep(2.0)  # blocking work longer than the deadline is what this test is about
        runs.end(ctx.attempt)
        return {"late": True, "attempt": ctx.attempt}

    executions = await broker.bucket(broker.names.executions_bucket, Execution)
    acks: list[object] = []
    with capture_logs() as logs:
        async with agent.running(broker=broker), ReachClient(broker=broker) as client:
            invoking = asyncio.create_task(
                client.invoke("sync_slow", {}, message_id="slow-1", on_ack=acks.append)
            )
            await asyncio.to_thread(runs.started.wait, 5)
            await asyncio.sleep(1.6)  # past the deadline and the claim's first lease (1.3 s)
            held = await executions.get(execution_key(client.caller, "slow-1", "thread-1"))
            result = await invoking
            completed = await watcher.event("completed", message_id="slow-1")
    assert result == {"late": True, "attempt": 1}
    assert completed.detail["past_deadline_ms"] == 300  # the trace says it ran late
    assert "(past its 300 ms deadline: it could not be stopped)" in described(completed)
    assert held is not None and held.value.state == "running"
    assert held.value.lease_until_ms > now_ms()
    assert list(runs.spans) == [1]
    assert len(acks) == 1
    said = [e.event for e in watcher.events if e.message_id == "slow-1"]
    assert "failed" not in said and said.count("accepted") == 1
    assert [entry["event"] for entry in logs].count(OVERRUN) == 1
    done = await executions.get(execution_key(client.caller, "slow-1", "thread-1"))
    assert done is not None and done.value.state == "done"


@pytest.mark.parametrize(
    ("raised", "reported"),
    [(RuntimeError("disk full"), "RuntimeError"), (TimeoutError(), "deadline_exceeded")],
)
async def test_a_thread_that_fails_past_its_deadline_is_retried_only_once_it_ended(
    broker, coordinator, watcher, raised: Exception, reported: str
):
    """An error raised after the deadline is the run's outcome (its own type; a TimeoutError
    is deadline_exceeded) and is reported once the thread ended: the retry starts after."""
    agent = Agent("thread-2", startup_delay=0)
    runs = Runs()

    @agent.handler("sync_fail", deadline_ms=300, max_attempts=2)
    def sync_fail(ctx: TaskContext, payload: dict) -> dict:
        runs.start(ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(1.0)  # past the deadline before it fails
            runs.end(ctx.attempt)
            raise raised
        runs.end(ctx.attempt)
        return {"attempt": ctx.attempt}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("sync_fail", {}, message_id="fail-1")
        failed = await watcher.event("failed", message_id="fail-1")
    assert result == {"attempt": 2}
    assert failed.detail["error"]["type"] == reported
    assert failed.detail["error"]["retryable"] is True
    first_ended, second_started = runs.spans[1][1], runs.spans[2][0]
    assert second_started > first_ended
