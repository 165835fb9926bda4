"""`reach publish`: who it sends as, and what it says and exits with when a task does not
end well."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from agentreach.agents import Agent, TaskContext, TaskFailed
from agentreach.broker import read_stream
from agentreach.cli.exit_codes import FAILED, OK, OUTCOME_UNKNOWN
from agentreach.cli.publish import how_it_ended
from agentreach.envelopes import ErrorInfo
from tests.cli.conftest import reach_argv, reach_command, run
from tests.secured import SECURED


async def test_publish_sends_as_the_caller_client_as_its_help_says(broker):
    """The task is stored on reach.task.TOPIC.client (the caller `client`; the name in the
    creds when given), and --help says so and that the caller's quota applies."""
    published = await run(*reach_argv(broker, "publish", "summarize", "{}"))
    helped = await run(reach_command(), "publish", "--help")
    stored = await read_stream(broker, broker.names.tasks_stream, broker.names.tasks_wildcard)
    caller = "admin" if SECURED else "client"  # the suite's operator creds, when secured
    assert published.returncode == OK, published.stderr
    assert [m.subject for m in stored] == [broker.names.task("summarize", caller)]
    said = " ".join(helped.stdout.split())
    assert "reach.task.TOPIC.client" in said and "quota" in said, said


async def test_publish_wait_says_how_a_failed_task_ended_and_exits_1(broker, coordinator):
    """A handler that keeps failing: the one line names the ending, the attempts, the dead
    letter and the agent's error, and where to read more; exit 1."""
    agent = Agent("cli-breaks", startup_delay=0)

    @agent.handler("breaks")
    async def breaks(ctx: TaskContext, payload: Any) -> Any:
        return payload.get("text")  # a list has no .get: AttributeError on every attempt

    async with agent.running(broker=broker):
        failed = await run(*reach_argv(broker, "publish", "breaks", "[1]", "--wait"))
    said = failed.stderr.strip().splitlines()[-1]
    assert failed.returncode == FAILED, failed.stderr
    assert said.startswith(
        "reach: error: retries_exhausted after 3 attempts, dead-lettered: AttributeError:"
        " 'list' object has no attribute 'get'"
    ), said
    assert "reach dlq show " in said


async def test_publish_wait_tells_a_task_that_never_ran_from_one_that_may_still_run(
    broker, coordinator, watcher
):
    """A refusal (no_route) exits 1, saying nothing ran; a task no agent acknowledged in
    time exits 3: it may still run (its agent is busy), so it is not a failure."""
    gate = asyncio.Event()
    agent = Agent("cli-busy-one", startup_delay=0)

    @agent.handler("slow", capacity=1)
    async def slow(ctx: TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    nobody = await run(*reach_argv(broker, "publish", "nobody_serves", "{}", "--wait"))
    async with agent.running(broker=broker):
        await run(*reach_argv(broker, "publish", "slow", "{}"))
        await watcher.event("accepted", topic="slow")  # its one slot is taken
        argv = reach_argv(broker, "publish", "slow", "{}", "--wait", "--ack-ms", "300")
        waited = await run(*argv)
        gate.set()
    assert nobody.returncode == FAILED, nobody.stderr
    assert "no_route, dead-lettered, nothing ran: no_route:" in nobody.stderr
    assert waited.returncode == OUTCOME_UNKNOWN, waited.stderr
    assert "may still run" in waited.stderr


async def test_execute_ms_sets_the_tasks_execute_budget_and_is_checked(
    broker, coordinator, watcher
):
    """Stored with the budget asked for; with --wait, the handler is held to it (a handler
    slower than it fails `deadline_exceeded`); out of range, nothing is sent."""
    agent = Agent("cli-slow", startup_delay=0)

    @agent.handler("slow")
    async def slow(ctx: TaskContext, payload: Any) -> Any:
        await asyncio.sleep(5)
        return payload

    published = await run(*reach_argv(broker, "publish", "nobody", "{}", "--execute-ms", "1234"))
    refused = await run(*reach_argv(broker, "publish", "nobody", "{}", "--execute-ms", "0"))
    letter = await watcher.dead_letter("no_route", topic="nobody")  # with the task as sent
    async with agent.running(broker=broker):
        waited = await run(
            *reach_argv(broker, "publish", "slow", "{}", "--wait", "--execute-ms", "300")
        )
    assert published.returncode == OK, published.stderr
    assert letter.envelope is not None and letter.envelope.budget.execute_ms == 1234
    assert refused.returncode != OK and "--execute-ms takes a number of ms" in refused.stderr
    assert waited.returncode == FAILED, waited.stderr
    assert "deadline_exceeded" in waited.stderr


async def test_publish_wait_says_a_task_accepted_and_not_done_may_still_complete(
    broker, coordinator, watcher
):
    """Accepted, and running past its execute budget (a `def` handler cannot be stopped):
    it said "may still run (until its ttl, 500 ms)", its ttl long past; it may complete."""
    release = threading.Event()
    agent = Agent("cli-stuck", startup_delay=0)

    @agent.handler("stuck")
    def stuck(ctx: TaskContext, payload: Any) -> Any:
        release.wait(10)
        return payload

    async with agent.running(broker=broker):
        argv = ("publish", "stuck", "{}", "--wait", "--ttl-ms", "500", "--message-id", "stuck-1")
        waited = await run(*reach_argv(broker, *argv))
        release.set()
        await watcher.event("completed", message_id="stuck-1")
    assert waited.returncode == OUTCOME_UNKNOWN, waited.stderr
    assert "stuck-1 may still complete: follow it with `reach trace stuck-1`" in waited.stderr
    assert "until its ttl" not in waited.stderr


def test_one_attempt_is_said_only_of_retries_that_ran_out():
    """`reach publish --wait` of a failed workflow said "workflow_failed after 1 attempt"."""
    error = ErrorInfo(type="failed", message="step 'a': boom", retryable=False)
    ids = {"message_id": "m-1", "trace_id": "m-1"}
    workflow = TaskFailed(error, **ids, ending="workflow_failed", attempt=1, attempts=1)
    exhausted = TaskFailed(error, **ids, ending="retries_exhausted", attempt=1, attempts=1)
    retried = TaskFailed(error, **ids, ending="retries_exhausted", attempt=4, attempts=3)
    assert how_it_ended(workflow).startswith("workflow_failed, dead-lettered: failed:")
    assert how_it_ended(exhausted).startswith("retries_exhausted after 1 attempt, dead-lettered")
    assert how_it_ended(retried).startswith("retries_exhausted after 3 attempts, dead-lettered")


async def test_a_coordinator_that_listens_and_answers_nothing_is_not_called_gone(broker):
    """A SIGSTOPped coordinator still listens: `reach publish` said "no coordinator is
    running" (a re-trial). It says one listens but did not answer, with and without --wait."""
    silent = await broker.nc.subscribe(broker.names.status)  # listens, never answers
    try:
        waited = await run(*reach_argv(broker, "publish", "t", "{}", "--wait"))
        sent = await run(*reach_argv(broker, "publish", "t", "{}"))
    finally:
        await silent.unsubscribe()
    assert waited.returncode == FAILED, waited.stderr
    assert "one listens but did not answer (stopped with SIGSTOP" in waited.stderr
    assert "not published" in waited.stderr and "no coordinator is running" not in waited.stderr
    assert sent.returncode == OK, sent.stderr
    assert "reach: warning: no coordinator answers: one listens" in sent.stderr
