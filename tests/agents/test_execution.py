"""Executing tasks on a real server: replies in order, failures, deadlines, expiry."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import threading
import time
import traceback

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, PermanentError, ReachClient, TaskContext, TaskFailed
from agentreach.agents.reports import Reports
from agentreach.broker import Broker, Delivery, EmbeddedServer, Names, Topology, provision
from agentreach.broker.dead_letters import RAW_KEPT
from agentreach.broker.lifecycle import emit, event_for, trace_of
from agentreach.envelopes import AgentCard, Progress
from agentreach.envelopes import headers as h
from tests.support import DISPATCHED, recorded, until_true


def agent_with_handlers() -> Agent:
    agent = Agent("exec-1", startup_delay=0)

    @agent.handler("slow_report", capacity=2)
    async def slow_report(ctx: TaskContext, payload: dict) -> dict:
        await ctx.progress("half way")
        return {"done": True, "attempt": ctx.attempt}

    @agent.handler("blocking", capacity=2)
    def blocking(ctx: TaskContext, payload: dict) -> dict:
        time.sleep(0.05)  # a blocking call: must not run on the event loop
        return {"thread": threading.current_thread().name}

    @agent.handler("refuse")
    async def refuse(ctx: TaskContext, payload: dict) -> dict:
        raise PermanentError("order 7 is already refunded")

    @agent.handler("crash")
    async def crash(ctx: TaskContext, payload: dict) -> dict:
        raise RuntimeError("database unavailable")

    @agent.handler("overrun", deadline_ms=100)
    async def overrun(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(30)
        return {}

    return agent


async def test_invoke_sees_ack_then_progress_then_result(broker, coordinator):
    """on_ack, on_progress and the result arrive in that order."""
    seen: list[str] = []
    async with agent_with_handlers().running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke(
            "slow_report",
            {},
            on_ack=lambda a: seen.append("ack"),
            on_progress=lambda p: seen.append(f"progress:{p.note}"),
        )
    assert seen == ["ack", "progress:half way"]
    assert result == {"done": True, "attempt": 1}


async def test_a_callback_that_raises_does_not_abort_the_invoke(broker, coordinator):
    """An `on_progress` that raised aborted the invoke with its own error (no message id):
    the task ran on and completed, its result nowhere, and a resend under a new id would run
    it twice. The error is logged; the invoke goes on to the result."""

    def broken(progress: object) -> None:
        raise ZeroDivisionError("the caller's own bug")

    async with agent_with_handlers().running(broker=broker), ReachClient(broker=broker) as client:
        with capture_logs() as logs:
            result = await client.invoke("slow_report", {}, on_ack=broken, on_progress=broken)
    assert result == {"done": True, "attempt": 1}
    said = [e["event"] for e in logs if e["log_level"] == "error"]
    assert said == [
        "the invoke's ack callback raised; it goes on",
        "the invoke's progress callback raised; it goes on",
    ]


async def test_sync_handler_runs_in_a_worker_thread(broker, coordinator):
    """A plain function handler runs off the event loop."""
    async with agent_with_handlers().running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("blocking", {})
    assert result["thread"] != threading.main_thread().name


async def test_permanent_error_is_rejected(broker, coordinator, watcher):
    """A PermanentError ends in REACH_DLQ as rejected, and the caller gets the error."""
    async with agent_with_handlers().running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke("refuse", {"order": 7})
    letter = await watcher.dead_letter("rejected", topic="refuse")
    assert caught.value.error.type == "PermanentError"
    assert caught.value.error.retryable is False
    assert caught.value.ending == "rejected"
    assert letter.error is not None and letter.error.message == "order 7 is already refunded"
    assert letter.envelope is not None and letter.envelope.payload == {"order": 7}
    assert [e.event for e in letter.trace] == ["routed", "accepted", "failed"]  # no retry


async def test_always_failing_handler_ends_after_the_configured_attempts(
    broker, coordinator, watcher
):
    """An ordinary exception is retried; after 3 attempts it ends as retries_exhausted."""
    async with agent_with_handlers().running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed, match="RuntimeError: database unavailable") as caught:
            await client.invoke("crash", {})
        assert caught.value.ending == "retries_exhausted"
        with pytest.raises(TaskFailed) as again:  # its end, read from its events this time
            await client.invoke("crash", {}, message_id=caught.value.message_id)
        assert again.value.ending == "retries_exhausted"
    letter = await watcher.dead_letter("retries_exhausted", topic="crash")
    assert letter.error is not None and letter.error.retryable
    assert letter.attempts == 3
    failed = [e.attempt for e in letter.trace if e.event == "failed"]
    assert failed == [1, 2, 3]


async def test_a_handler_that_raises_is_logged_with_where_it_raised(broker, coordinator):
    """The agent's log names the handler's file and line (a bare `KeyError: 'x'` did not);
    a deadline, which says nothing by its traceback, and a PermanentError, a refusal on
    purpose, are logged without one."""
    async with agent_with_handlers().running(broker=broker), ReachClient(broker=broker) as client:
        with capture_logs() as logs, pytest.raises(TaskFailed):
            await client.invoke("crash", {}, message_id="crash-logged")
        with capture_logs() as overrun_logs, pytest.raises(TaskFailed):
            await client.invoke("overrun", {}, message_id="overrun-logged")
        with capture_logs() as refusal_logs, pytest.raises(TaskFailed):
            await client.invoke("refuse", {"order": 7}, message_id="refused-logged")
    raised = [e for e in logs if e["event"] == "handler raised"]
    assert raised and all(isinstance(e["exc_info"], RuntimeError) for e in raised)
    frames = traceback.extract_tb(raised[0]["exc_info"].__traceback__)
    assert frames[-1].name == "crash" and frames[-1].filename == __file__
    assert [e["error_type"] for e in raised] == ["RuntimeError"] * 3  # once a failure, each
    assert not [e for e in logs if e["event"] == "handler failed"]  # attempt: not twice
    assert not [e for e in overrun_logs if e["event"] == "handler raised"]
    # A PermanentError is a refusal on purpose: no warning with a stack ("handler failed" at
    # info says it).
    assert not [e for e in refusal_logs if e["event"] == "handler raised"]


@pytest.mark.parametrize("kind", ["async", "def"])
async def test_a_timeout_error_of_the_handler_s_own_is_reported_as_it_is(
    broker, coordinator, watcher, kind: str
):
    """An upstream call's TimeoutError, raised in time, read "deadline_exceeded: handler ran
    past 30000 ms" after 2 ms, its message nowhere."""
    agent = Agent(f"own-timeout-{kind}", startup_delay=0)

    def upstream(ctx: TaskContext, payload: object) -> object:
        raise TimeoutError("upstream timed out")

    async def upstream_async(ctx: TaskContext, payload: object) -> object:
        raise TimeoutError("upstream timed out")

    handler = upstream_async if kind == "async" else upstream
    agent.handler(f"upstream-{kind}", max_attempts=1)(handler)
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke(f"upstream-{kind}", {})
    error = caught.value.error
    assert (error.type, error.message, error.retryable) == (
        "TimeoutError",
        "upstream timed out",
        True,
    )


@pytest.mark.parametrize("kind", ["async", "def"])
async def test_sys_exit_in_a_handler_fails_its_task_and_the_agent_serves_on(
    broker, coordinator, kind: str
):
    """A library that called `sys.exit(3)` in a handler stopped the whole agent, the log
    saying only "agent stopped", and its task was moved on as `reassigned`."""
    agent = Agent(f"exiting-{kind}", startup_delay=0)

    def leave(ctx: TaskContext, payload: object) -> object:
        if payload == "exit":
            sys.exit(3)
        return "served"

    async def leave_async(ctx: TaskContext, payload: object) -> object:
        return leave(ctx, payload)

    agent.handler(f"leave-{kind}", max_attempts=1)(leave_async if kind == "async" else leave)
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke(f"leave-{kind}", "exit")
        assert await client.invoke(f"leave-{kind}", "again") == "served"
    error = caught.value.error
    assert (error.type, error.message) == (
        "SystemExit",
        "the handler raised SystemExit(3) (sys.exit())",
    )


async def test_deadline_cancels_an_async_handler(broker, coordinator, watcher):
    """A handler past its deadline_ms is cancelled and reported as deadline_exceeded."""
    async with agent_with_handlers().running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke("overrun", {})
    assert caught.value.error.type == "deadline_exceeded"
    failed = await watcher.event("failed", topic="overrun")
    assert failed.detail["error"]["message"] == "handler ran past 100 ms"


async def test_a_task_that_expired_in_the_agent_queue_is_not_run(broker, coordinator, watcher):
    """A dispatched task whose ttl passed while queued is dead-lettered as expired, not run."""
    agent = agent_with_handlers()
    task = envelopes.Task(
        v=1,
        message_id="stale-1",
        trace_id="stale-1",
        topic="slow_report",
        ttl_ms=200,
        to_agent=agent.agent_id,
        received_ms=envelopes.now_ms() - 5_000,  # routed late: 200 ms is what was left
    )
    await emit(broker, event_for(task, "routed", agent_id=agent.agent_id))  # as the router does
    await broker.publish(
        broker.names.dispatch(agent.agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    await asyncio.sleep(0.3)  # the passing of the ttl is what this test is about
    async with agent.running(broker=broker):
        letter = await watcher.dead_letter("expired", topic="slow_report")
    assert letter.message_id == "stale-1"
    assert not any(e.event == "accepted" for e in watcher.events)
    expired = await watcher.event("expired", message_id="stale-1")
    said = expired.detail["error"]["message"]
    assert said.startswith(f"its ttl passed in the queue of {agent.agent_id} (200 ms of it were")
    assert re.search(r"dispatched there, 5\.\d s after it was taken in\)$", said), said


async def test_a_task_ended_as_expired_is_not_run_though_its_ttl_seems_left(
    broker, coordinator, watcher
):
    """An agent whose clock runs behind sees ttl left in a task the coordinator's pass over
    the queues ended already: the attempt's expiry fence stands in its record, so it does
    not run the task; it reports it expired instead (which ends nothing more)."""
    agent = agent_with_handlers()
    task = envelopes.Task(
        v=1,
        message_id="fenced-1",
        trace_id="fenced-1",
        topic="slow_report",
        ttl_ms=60_000,
        to_agent=agent.agent_id,
    )
    message = "ttl 60000 ms passed in the queue of exec-1, which did not take it"
    error = envelopes.ErrorInfo(type="expired", message=message, retryable=False)
    await recorded(broker, "fenced-1", agent.agent_id, "failed", error=error, finished_at_ms=1)
    await broker.publish(
        broker.names.dispatch(agent.agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    async with agent.running(broker=broker):
        reported = await watcher.event("expired", message_id="fenced-1")
    ran = [e.event for e in watcher.events if e.event in ("progress", "completed", "failed")]
    assert reported.agent_id == agent.agent_id
    assert ran == []


async def test_an_attempt_moved_to_another_agent_is_not_run_by_a_process_that_fetched_it(
    broker, coordinator, watcher
):
    """An agent judged gone comes back and fetches an attempt from its durable queue: the
    fence in its record says the attempt was moved on, so it does not run it; it reports it
    (`failed`, with the fence's error). Here the move was cut short after its fence (the
    coordinator or the server died: a chaos run lost such a task for good), so nothing
    shows attempt 2: the coordinator sends it on from the report, and it runs once."""
    agent = agent_with_handlers()
    task = envelopes.Task(
        v=1,
        message_id="moved-1",
        trace_id="moved-1",
        topic="slow_report",
        ttl_ms=60_000,
        to_agent=agent.agent_id,
    )
    error = envelopes.ErrorInfo(
        type=envelopes.REASSIGNED, message="its agent went OFFLINE", retryable=True
    )
    await recorded(broker, "moved-1", agent.agent_id, "failed", error=error, finished_at_ms=1)
    await emit(broker, event_for(task, "routed", agent_id=agent.agent_id))  # as the router does
    await broker.publish(
        broker.names.dispatch(agent.agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    async with agent.running(broker=broker):
        completed = await watcher.event("completed", message_id="moved-1")
        reported = await watcher.event("failed", message_id="moved-1")
    assert reported.attempt == 1 and reported.detail["error"]["type"] == envelopes.REASSIGNED
    assert completed.attempt == 2 and completed.detail["result"] == {"done": True, "attempt": 2}
    assert watcher.count("completed", {"moved-1"}) == 1


async def test_undecodable_dispatch_is_dead_lettered(broker, coordinator, watcher):
    """Garbage on an agent's dispatch subject ends in REACH_DLQ, not in silence."""
    agent = agent_with_handlers()
    subject = broker.names.dispatch(agent.agent_id, "P0")
    await broker.publish(subject, b"\xff not json", headers={h.MSG_ID: "junk"})
    async with agent.running(broker=broker):
        letter = await watcher.dead_letter("invalid_envelope")
    assert letter.raw == "base64:" + "/yBub3QganNvbg=="
    assert letter.headers[h.MSG_ID] == "junk"


async def test_an_undecodable_dispatch_too_large_to_report_whole_is_reported_cut(
    broker, coordinator, watcher
):
    """A body that would not fit in the report once JSON-escaped (each quote doubles) is
    reported cut, and its dead letter says so, instead of failing to be reported."""
    agent = agent_with_handlers()
    subject = broker.names.dispatch(agent.agent_id, "P0")
    await broker.publish(subject, b'"' * 600_000)
    async with agent.running(broker=broker):
        letter = await watcher.dead_letter("invalid_envelope")
    assert letter.truncated
    assert letter.raw == '"' * RAW_KEPT + "…"


async def test_a_report_of_an_undecodable_dispatch_cannot_name_another_message(
    broker, coordinator, watcher
):
    """The dead letter of a report has an id of its own: an agent that names a real message
    in one puts no dead letter into that message's trace, and does not take the id that
    message's own dead letter is deduplicated by."""
    victim = envelopes.Task(v=1, message_id="victim-1", trace_id="victim-1", topic="_invalid")
    error = envelopes.ErrorInfo(type="invalid_envelope", message="forged", retryable=False)
    report = event_for(victim, "failed", agent_id="liar", error=error, raw="forged", headers={})
    await emit(broker, report, sender="liar")
    letter = await watcher.dead_letter("invalid_envelope")
    await watcher.event("dead_lettered", message_id=letter.message_id)  # written before it
    assert letter.message_id != "victim-1"
    assert letter.headers["Reach-Reported-Id"] == "victim-1"
    assert letter.headers["Reach-Reported-By"] == "liar"
    assert "dead_lettered" not in [e.event for e in await trace_of(broker, "victim-1")]
    subject = broker.names.dlq("expired", "anything")
    stored = await broker.publish(subject, b"{}", headers={h.MSG_ID: "dlq-victim-1"})
    assert not stored.duplicate


async def test_registration_reuses_the_record_and_raises_the_epoch(broker):
    """Restarting with the same id keeps one record, epoch + 1, and marks it stopped on exit."""
    kv = await broker.kv(broker.names.agents_bucket)
    agent = agent_with_handlers()
    async with agent.running(broker=broker):
        first = msgspec.json.decode((await kv.get(agent.agent_id)).value, type=AgentCard)
    async with agent.running(broker=broker):
        second = msgspec.json.decode((await kv.get(agent.agent_id)).value, type=AgentCard)
    stopped = msgspec.json.decode((await kv.get(agent.agent_id)).value, type=AgentCard)
    assert (first.epoch, second.epoch) == (1, 2)
    assert first.status == second.status == "running"
    assert stopped.status == "stopped"
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    assert list(await cards.snapshot()) == [agent.agent_id]  # nats-py's kv.keys() is racy
    assert sorted(first.intents) == ["blocking", "crash", "overrun", "refuse", "slow_report"]


async def test_a_deleted_card_does_not_start_the_epoch_again_at_1(broker):
    """`reach agents forget` (or `nats kv del`) deletes a card: the next process registered
    with epoch 1, below the epochs the id had, and waited out a crashed process's claims of a
    higher epoch instead of taking them over. The delete marker's revision is past them."""
    kv = await broker.kv(broker.names.agents_bucket)
    agent = agent_with_handlers()
    for _ in range(3):
        async with agent.running(broker=broker):
            pass
    had = msgspec.json.decode((await kv.get(agent.agent_id)).value, type=AgentCard).epoch
    await kv.delete(agent.agent_id)
    async with agent.running(broker=broker) as runtime:
        card = msgspec.json.decode((await kv.get(agent.agent_id)).value, type=AgentCard)
    assert had == 3
    assert card.epoch > had and runtime.card.epoch == card.epoch


async def test_an_agent_whose_server_came_back_empty_registers_again(tmp_path):
    """A server restarted on an empty store (then provisioned again) has no card of an agent
    that rode out the restart; routing knows agents by their cards, so the agent writes its
    own again, with the epoch it serves under."""
    names = Names(prefix="rehome")
    agent = Agent("rehomed-1", startup_delay=0, heartbeat_interval=0.5)
    agent.handler("noop")(_noop)
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(EmbeddedServer(port=-1, store_dir=tmp_path / "a"))
        async with Broker(first.url, names=names) as admin:
            await provision(admin, Topology.default(names))
        second = EmbeddedServer(port=first.port, store_dir=tmp_path / "b")
        stack.push_async_callback(second.stop)  # after the agent has stopped
        runtime = await stack.enter_async_context(agent.running(first.url, names=names))
        before = runtime.card
        await first.stop()
        await second.__aenter__()
        admin = await stack.enter_async_context(Broker(second.url, names=names))
        await provision(admin, Topology.default(names))
        cards = await admin.bucket(names.agents_bucket, AgentCard)
        found = await until_true(lambda: cards.get(agent.agent_id), timeout=20)
    assert before is not None and found.value == before
    assert found.value.status == "running"


async def test_child_tasks_carry_the_trace_and_what_is_left_of_the_budget(
    broker, coordinator, watcher
):
    """A task a handler publishes keeps the trace_id and gets at most the remaining budget."""
    agent = Agent("parent-1", startup_delay=0)

    @agent.handler("plan", deadline_ms=5_000)
    async def plan(ctx: TaskContext, payload: dict) -> dict:
        child = await ctx.publish("write", {"outline": 1})
        return {"child": child.message_id}

    @agent.handler("write")
    async def write(ctx: TaskContext, payload: dict) -> dict:
        return {"budget_ms": ctx.envelope.budget.execute_ms, "from": ctx.envelope.from_agent}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("plan", {}, trace_id="saga-1")
        child = await watcher.event("completed", message_id=result["child"])
    assert child.trace_id == "saga-1"
    assert 0 < child.detail["result"]["budget_ms"] <= 5_000
    assert child.detail["result"]["from"] == "parent-1"


async def test_a_result_that_cannot_be_encoded_fails_once_as_invalid_result(
    broker, coordinator, watcher
):
    """A handler that returns what JSON cannot carry ran, and would run the same way again:
    it fails once, not retried, as invalid_result, saying it was the result that failed."""
    agent = Agent("unsendable-1", startup_delay=0)
    runs: list[int] = []

    @agent.handler("unsendable")
    async def unsendable(ctx: TaskContext, payload: dict) -> dict:
        runs.append(ctx.attempt)
        return {"when": object()}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke("unsendable", {})
        letter = await watcher.dead_letter("rejected", topic="unsendable")
    error = caught.value.error
    assert (error.type, error.retryable) == ("invalid_result", False)
    assert error.message.startswith("the handler's result could not be sent")
    assert "Encoding objects of type object is unsupported" in error.message
    assert runs == [1]
    assert [e.event for e in letter.trace] == ["routed", "accepted", "failed"]


async def _noop(ctx: TaskContext, payload: object) -> object:
    return payload


async def test_a_slow_progress_report_does_not_fail_a_thread_handler(broker, coordinator):
    """progress_sync waits ``timeout`` for the report; past it the handler goes on and the
    report is still sent (it raised TimeoutError, which failed the work as a deadline)."""
    agent = Agent("sync-reporter", startup_delay=0)
    heard = threading.Event()

    @agent.handler("sync_report")
    def sync_report(ctx: TaskContext, payload: dict) -> dict:
        ctx.progress_sync("half way", timeout=0)  # no report is through in no time
        # Until the caller heard it: a report still on its way when the run ends is cut.
        return {"done": True, "heard": heard.wait(10)}

    notes: list[str] = []

    def on_progress(progress: Progress) -> None:
        notes.append(progress.note)
        heard.set()

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("sync_report", {}, on_progress=on_progress)
    assert result == {"done": True, "heard": True}
    assert notes == ["half way"]


@pytest.mark.parametrize("size", [400_000, 1_100_000])
async def test_a_result_its_record_cannot_hold_fails_once_saying_so(
    broker, coordinator, watcher, size
):
    """An agent that claim-checks nothing (claim_check_bytes above the record limit, as on a
    secured server) returns 400 KB: its record refuses it (10054); or 1.1 MB, over what the
    server takes in one message (its record write looped as if the server were away, until
    the task's ttl: an outside trial). Ran once, rejected as `result_too_large` naming the
    size, not redelivered to max_deliveries without a word."""
    runs = 0
    agent = Agent("big-result", startup_delay=0, claim_check_bytes=2_000_000)

    @agent.handler("big")
    async def big(ctx: TaskContext, payload: object) -> str:
        nonlocal runs
        runs += 1
        return "x" * size

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke("big", {})
    assert caught.value.ending == "rejected" and runs == 1
    assert caught.value.error.type == "result_too_large"
    assert f"the result ({size + 2} bytes of JSON) does not fit its execution record" in str(
        caught.value.error.message
    )


@pytest.mark.parametrize("places", [4, 1])
async def test_a_redelivery_past_the_ttl_waits_for_the_run_this_process_holds(
    broker, coordinator, watcher, monkeypatch, places
):
    """The run's keep-alives did not reach the server (it was away), so the task came again
    past its ttl while the handler still ran here: that delivery reported it `expired`, "no
    run of it finished (each process that took it died or stalled)", though this very
    process was running it. It waits for that run, whose result answers; so does one that
    waited for the handler's one place, taken by that run, until its ttl ran out."""

    async def unheard(self) -> None:  # type: ignore[no-untyped-def]
        return None  # the server is away: no keep-alive arrives

    monkeypatch.setattr(Delivery, "in_progress", unheard)
    agent = Agent("unheard-1", startup_delay=0, ack_wait=0.5)

    @agent.handler("long_nap", capacity=places)
    async def long_nap(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(2.0)  # past its ttl, and several ack waits
        return {"napped": True}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("long_nap", {}, message_id="unheard-t1", ttl_ms=1000)
    assert result == {"napped": True}
    assert watcher.count("expired", {"unheard-t1"}) == 0
    assert watcher.count("completed", {"unheard-t1"}) >= 1


async def test_a_progress_report_the_server_does_not_take_does_not_hold_the_handler(
    broker, coordinator, monkeypatch
):
    """With the server away, each `await ctx.progress()` waited out the publish's retries:
    a 3 s job took 24 s, and one ran past its execute budget. A report is waited for a
    moment, then left on its way; one made meanwhile is not made."""
    reported: list[str] = []
    taken = asyncio.Event()  # the server never takes these reports while the handler runs

    async def unheard(self, job, note: str) -> None:  # type: ignore[no-untyped-def]
        reported.append(note)
        await taken.wait()

    monkeypatch.setattr(Reports, "progress", unheard)
    agent = Agent("chatty-1", startup_delay=0)

    @agent.handler("chatty")
    async def chatty(ctx: TaskContext, payload: dict) -> str:
        for step in range(3):
            await ctx.progress(f"step {step}")
        return "done"

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("chatty", {}, execute_deadline_ms=20_000)
    taken.set()
    assert result == "done"
    assert reported == ["step 0"]  # the next ones came while it was on its way
