"""Reliable delivery end to end: retries, exactly-once effect, crashes, dead letters."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentreach import envelopes
from agentreach.agents import (
    Agent,
    Compensation,
    CompensationWorker,
    NotAcknowledged,
    PermanentError,
    ReachClient,
    TaskContext,
)
from agentreach.broker import Broker, consumer_state, read_stream
from agentreach.broker.consume import ConsumerSpec, bind
from agentreach.broker.dead_letters import dead_letter
from agentreach.broker.lifecycle import emit, event_for
from agentreach.coordinator.routing.run_once import RunOnce
from agentreach.envelopes import AgentCard, DeadLetter, Execution, Intent, execution_key
from agentreach.envelopes import headers as h
from agentreach.envelopes.headers import task_headers
from tests.cli.conftest import reach_argv, run
from tests.conftest import FAST
from tests.secured import operators_reply_to
from tests.support import DISPATCHED, Watcher, put_value, recorded, until_true, wait_for_card

REPO = Path(__file__).parents[2]


def flaky_agent(runs: Counter[str], **options: object) -> Agent:
    agent = Agent("flaky-1", startup_delay=0, **options)  # type: ignore[arg-type]

    @agent.handler("flaky")
    async def flaky(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        if ctx.attempt < 3:
            raise ConnectionError(f"upstream down (attempt {ctx.attempt})")
        return {"ok": ctx.attempt}

    @agent.handler("hopeless", max_attempts=5)
    async def hopeless(ctx: TaskContext, payload: dict) -> dict:
        raise ConnectionError("still down")

    @agent.handler("slow", capacity=4)
    async def slow(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        for _ in range(payload.get("beats", 0)):
            await asyncio.sleep(payload["beat_s"])  # the work itself takes time
            await ctx.progress("still working")
        return {"beats": payload.get("beats", 0)}

    return agent


async def test_flaky_handler_succeeds_on_the_third_attempt(broker, coordinator):
    """Two failures then success: one completion, three attempts, growing delays."""
    runs: Counter[str] = Counter()
    async with flaky_agent(runs).running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("flaky", {}, trace_id="flaky-trace")
        message_id = next(iter(runs))

        # The result reply comes before the `completed` event is stored, and the watcher sees
        # an event before the stream stores it: read the trace once it holds the completion.
        async def ended() -> list[envelopes.Event] | None:
            events = await client.status(message_id)
            return events if events[-1].event == "completed" else None

        events = await until_true(ended, every_s=0.02)
        by_trace = await client.status("flaky-trace")  # the id of the trace works too
    assert result == {"ok": 3}
    assert by_trace == events
    assert runs[message_id] == 3
    assert [e.event for e in events if e.event in ("failed", "completed")] == [
        "failed",
        "failed",
        "completed",
    ]
    assert [e.attempt for e in events if e.event == "routed"] == [1, 2, 3]
    delays = [e.detail["delay_ms"] for e in events if e.event == "retry_scheduled"]
    assert len(delays) == 2 and delays[0] < delays[1]


async def test_per_intent_attempts_are_honoured(broker, coordinator, watcher):
    """An intent declared with max_attempts=5 is tried exactly five times."""
    runs: Counter[str] = Counter()
    async with flaky_agent(runs).running(broker=broker), ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("hopeless", {})
        letter = await watcher.dead_letter("retries_exhausted", message_id=message_id)
    assert letter.attempts == 5
    assert [e.attempt for e in letter.trace if e.event == "failed"] == [1, 2, 3, 4, 5]


async def test_the_final_error_says_how_the_message_ended(broker, coordinator, watcher):
    """The error reply after the last attempt carries the agent's error, and the reason the
    message ended with (retries_exhausted): a caller tells it from a refusal."""
    runs: Counter[str] = Counter()
    reply_to, listen_on = operators_reply_to(broker, "hopeless-box")
    replies = await broker.nc.subscribe(listen_on)
    task = envelopes.Task(
        v=1, message_id="hopeless-1", trace_id="hopeless-1", topic="hopeless", reply_to=reply_to
    )
    async with flaky_agent(runs).running(broker=broker):
        await broker.publish(broker.names.task("hopeless"), envelopes.encode(task))
        await watcher.dead_letter("retries_exhausted", message_id="hopeless-1", timeout=30)
    answers = []
    while not any(isinstance(a, envelopes.ErrorReply) for a in answers):
        answers.append(envelopes.decode_reply((await replies.next_msg(timeout=5)).data))
    final = answers[-1]
    assert isinstance(final, envelopes.ErrorReply) and final.reason == "retries_exhausted"
    assert final.error.type == "ConnectionError" and final.error.retryable


async def test_a_failure_with_no_time_left_for_a_retry_ends_at_once(broker, coordinator, watcher):
    """A retryable failure after the task's ttl has run out schedules no retry that could
    only expire: the task is dead-lettered as expired then, naming the attempt's error."""
    agent = Agent("late-1", startup_delay=0)

    @agent.handler("late")
    async def late(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(0.4)
        raise ConnectionError("upstream down")

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("late", {}, ttl_ms=300)
        letter = await watcher.dead_letter("expired", message_id=message_id)
    assert letter.error is not None
    assert "runs out before attempt 2" in letter.error.message
    assert "attempt 1 failed: ConnectionError: upstream down" in letter.error.message
    assert [e.event for e in letter.trace if e.event == "retry_scheduled"] == []
    assert [e.attempt for e in letter.trace if e.event == "routed"] == [1]
    assert letter.attempts == 1  # it ran: a TypeScript caller's trial read attempts 1 of 2


async def test_progress_beyond_the_ack_wait_prevents_redelivery(broker, coordinator, watcher):
    """A task running 3 times the agent's ack wait, sending progress, is delivered once."""
    runs: Counter[str] = Counter()
    agent = flaky_agent(runs, ack_wait=0.5)
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("slow", {"beats": 6, "beat_s": 0.25})
        consumer = broker.names.agent_consumer(agent.agent_id, "P1")
        info = await broker.js.consumer_info(broker.names.dispatch_stream("P1"), consumer)
    assert result == {"beats": 6}
    assert sum(runs.values()) == 1
    assert info.num_redelivered == 0
    assert [e.event for e in watcher.events].count("accepted") == 1


async def test_a_redelivered_task_is_not_run_again(broker, coordinator, watcher):
    """The same message reaching the agent twice (past dedup) runs once; both get the result."""
    runs: Counter[str] = Counter()
    agent = flaky_agent(runs)
    await _delivered_twice(broker, watcher, agent, "twice-1", after="completed")
    assert runs["twice-1"] == 1


async def test_a_redelivered_attempt_that_failed_is_not_run_again(broker, coordinator, watcher):
    """The same attempt reaching the agent again after its handler failed (the ack of its
    report lost) is not run again: its failure is reported again from the record. Before,
    it ran again, invisibly (the second `failed` event is a duplicate of the first)."""
    runs: Counter[str] = Counter()
    agent = Agent("refuser-1", startup_delay=0)

    @agent.handler("slow")
    async def refuse(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        raise PermanentError("no, once and for all")

    await _delivered_twice(broker, watcher, agent, "refused-1", after="failed")
    assert runs["refused-1"] == 1


async def _delivered_twice(
    broker: Broker, watcher: Watcher, agent: Agent, message_id: str, *, after: str
) -> None:
    """A ``slow`` task delivered to ``agent``, and once it said ``after``, delivered again
    (past dedup: a redelivery); returns once both are acknowledged."""
    task = _slow_task_for(agent, message_id)
    subject = broker.names.dispatch(agent.agent_id, "P1")
    async with agent.running(broker=broker):
        await broker.publish(subject, envelopes.encode(task), headers={h.MSG_ID: "copy-1"})
        await watcher.event(after, message_id=message_id)
        await broker.publish(subject, envelopes.encode(task), headers={h.MSG_ID: "copy-2"})
        await _until_consumed(broker, agent)


async def test_a_run_delivered_again_past_its_ttl_sends_its_result_again(
    broker, coordinator, watcher
):
    """A server failing over can lose the acknowledgement of a task an agent ran: the task
    is delivered again after the ack wait, often past its ttl. The agent sends the result
    it recorded again; the task is not reported expired, nor dead-lettered, nor run twice."""
    runs: Counter[str] = Counter()
    agent = Agent("one-slot", startup_delay=0)

    @agent.handler("slow", capacity=1)
    async def slow(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        await asyncio.sleep(payload.get("s", 0))  # the work itself takes time
        return {"slept": payload.get("s", 0)}

    task = _slow_task_for(agent, "late-1", ttl_ms=300)
    subject = broker.names.dispatch(agent.agent_id, "P1")
    async with agent.running(broker=broker):
        await broker.publish(subject, envelopes.encode(task), headers={h.MSG_ID: "late-copy-1"})
        await watcher.event("completed", message_id="late-1")
        # Its one slot taken by longer work: the copy waits past its ttl for it, as the
        # redelivery after an ack wait comes past it.
        work = _slow_task_for(agent, "blocker-1", payload={"s": 0.6})
        await broker.publish(subject, envelopes.encode(work), headers={h.MSG_ID: "blocker-1"})
        await watcher.event("accepted", message_id="blocker-1")
        await broker.publish(subject, envelopes.encode(task), headers={h.MSG_ID: "late-copy-2"})
        await watcher.until(
            lambda: watcher.count("completed", {"late-1"}) == 2 or None, "the result sent again"
        )
    [again] = [e for e in watcher.events if e.event == "completed" and e.message_id == "late-1"][1:]
    assert again.detail["result"] == {"slept": 0}
    assert runs["late-1"] == 1
    assert watcher.count("expired", {"late-1"}) == 0
    assert not [letter for letter in watcher.dead_letters if letter.message_id == "late-1"]


async def test_a_task_sent_again_past_its_ttl_after_it_ran_answers_from_its_record(
    broker, start_coordinator, watcher
):
    """The coordinator looks at the execution records before it ends a task as expired:
    a task that ran (its intake message redelivered after a coordinator crash, or sent
    again) is answered from its record, not dead-lettered."""
    runs: Counter[str] = Counter()
    agent = flaky_agent(runs)
    task = envelopes.Task(
        v=1, message_id="again-1", trace_id="again-1", topic="slow", payload={}, ttl_ms=1500
    )
    intake = broker.names.task("slow")
    async with agent.running(broker=broker):
        async with start_coordinator(FAST):
            headers = task_headers(task, msg_id="again-copy-1")
            await broker.publish(intake, envelopes.encode(task), headers=headers)
            await watcher.event("completed", message_id="again-1")
        headers = task_headers(task, msg_id="again-copy-2")
        await broker.publish(intake, envelopes.encode(task), headers=headers)
        await asyncio.sleep(1.6)  # the passing of the ttl is what this test is about
        async with start_coordinator(FAST):
            answered = await watcher.event("answered_from_record", message_id="again-1")
    assert answered.agent_id == agent.agent_id
    assert runs["again-1"] == 1
    assert watcher.count("completed", {"again-1"}) == 1  # it had ended: not said again
    assert not [letter for letter in watcher.dead_letters if letter.message_id == "again-1"]


async def test_another_request_sent_past_the_window_under_an_id_that_ran_is_refused(
    broker, coordinator, watcher
):
    """Past the duplicate window a message id that ran is answered from its record, but not
    for another request under it (another payload): that one is refused as duplicate_id,
    in a letter that replays it under an id of its own, not given the first one's result."""
    runs: Counter[str] = Counter()
    first = envelopes.Task(v=1, message_id="order-8", trace_id="t", topic="slow", payload={})
    other = msgspec.structs.replace(first, payload={"beats": 0, "item": 2})
    intake = broker.names.task("slow")
    async with flaky_agent(runs).running(broker=broker):
        for n, task in enumerate((first, other, first)):  # each past the window: own copy ids
            headers = task_headers(task, msg_id=f"order-8-copy-{n}")
            await broker.publish(intake, envelopes.encode(task), headers=headers)
            if n == 0:
                await watcher.event("completed", message_id="order-8")
        letter = await watcher.dead_letter("rejected", message_id="order-8")
        await watcher.event("answered_from_record", message_id="order-8")
    assert runs["order-8"] == 1
    assert letter.error is not None and letter.error.type == "duplicate_id"
    assert "'order-8' is of an earlier request of yours, which had another payload" in (
        letter.error.message
    )
    assert letter.envelope is not None and letter.envelope.payload == {"beats": 0, "item": 2}
    assert not [e for e in watcher.events if e.detail.get("problem") == "ended_twice"]


async def test_an_expired_report_of_a_task_done_already_is_answered_from_its_record(
    broker, coordinator, watcher
):
    """An agent of another SDK may report a redelivery of a task it ran as expired: the
    coordinator finds the result it recorded, and answers from it instead of dead-lettering
    work that was done."""
    task = envelopes.Task(v=1, message_id="done-1", trace_id="done-1", topic="slow", ttl_ms=300)
    await recorded(
        broker,
        "done-1",
        "other-sdk-1",
        "done",
        finished_at_ms=envelopes.now_ms(),
        result={"beats": 0},
    )
    error = envelopes.ErrorInfo(
        type="expired", message="ttl 300 ms passed in the queue of other-sdk-1", retryable=False
    )
    report = event_for(
        task, "expired", agent_id="other-sdk-1", task=task, error=error, dispatched_at_ms=1
    )
    await emit(broker, event_for(task, "routed", agent_id="other-sdk-1"))  # as it was
    await emit(broker, report, sender="other-sdk-1")
    answered = await watcher.event("answered_from_record", message_id="done-1")
    assert answered.agent_id == "other-sdk-1"
    assert not [letter for letter in watcher.dead_letters if letter.message_id == "done-1"]


async def test_an_expired_report_read_past_a_replica_behind_ends_the_task_from_its_record(
    broker, coordinator, watcher, monkeypatch
):
    """A cluster catching up after a lost majority: the records read for an agent's
    `expired` report came from a replica behind (no `done` yet), the expiry fence then found
    the task done, and the report was dropped: the task never ended (no `completed`, no
    reply, no letter). It is answered from its record."""
    task = envelopes.Task(v=1, message_id="behind-1", trace_id="behind-1", topic="slow", ttl_ms=300)
    now = envelopes.now_ms()
    await recorded(
        broker, "behind-1", "lagged-1", "done", started_ms=now - 40, finished_at_ms=now,
        result={"n": 1},
    )  # fmt: skip
    records = RunOnce.records
    behind = {"behind-1"}

    async def from_a_replica(self, task):  # type: ignore[no-untyped-def]
        if task.message_id in behind:  # the first read: a replica that has not the record
            behind.discard(task.message_id)
            return []
        return await records(self, task)

    monkeypatch.setattr(RunOnce, "records", from_a_replica)
    error = envelopes.ErrorInfo(type="expired", message="ttl 300 ms passed", retryable=False)
    report = event_for(
        task, "expired", agent_id="lagged-1", task=task, error=error, dispatched_at_ms=1
    )
    await emit(broker, event_for(task, "routed", agent_id="lagged-1"))  # as it was
    await emit(broker, report, sender="lagged-1")
    completed = await watcher.event("completed", message_id="behind-1")
    assert completed.detail["from_record"] is True and completed.detail["result"] == {"n": 1}
    assert completed.detail["duration_ms"] == 40  # when its run began is in the record
    assert not [letter for letter in watcher.dead_letters if letter.message_id == "behind-1"]


async def test_an_expired_report_of_a_run_that_began_says_one_attempt_ran(
    broker, coordinator, watcher
):
    """A run began (its claim, lapsed: its process killed) and the next delivery found the
    ttl past: the letter said `attempts: 0`, "nothing ran", though the work may have run."""
    task = envelopes.Task(v=1, message_id="began-1", trace_id="began-1", topic="slow", ttl_ms=300)
    await recorded(broker, "began-1", "killed-1", "running", lease_until_ms=envelopes.now_ms() - 1)
    error = envelopes.ErrorInfo(type="expired", message="ttl 300 ms ran out", retryable=False)
    report = event_for(task, "expired", agent_id="killed-1", task=task, error=error)
    await emit(broker, event_for(task, "routed", agent_id="killed-1"))  # as it was
    await emit(broker, report, sender="killed-1")
    letter = await watcher.dead_letter("expired", message_id="began-1")
    assert letter.attempts == 1


async def test_a_failure_reported_while_a_redelivery_runs_the_task_waits_for_that_run(
    broker, coordinator, watcher
):
    """A stalled agent (its process frozen) lets its claim's lease lapse; the redelivery of
    the task takes the claim over and runs it. When the stalled run wakes past its deadline,
    it reports a failure: that must not schedule a retry while the other run goes on; the
    message ends as that run ends (here done: answered from its record)."""
    task = envelopes.Task(v=1, message_id="stalled-1", trace_id="stalled-1", topic="slow")
    records = await broker.bucket(broker.names.executions_bucket, Execution)
    key = execution_key(None, "stalled-1", "stall-1")
    running = Execution(
        message_id="stalled-1",
        state="running",
        agent_id="stall-1",
        lease_until_ms=envelopes.now_ms() + 60_000,
    )
    revision = await records.create(key, running)
    error = envelopes.ErrorInfo(type="deadline_exceeded", message="handler ran past 500 ms")
    stale = event_for(task, "failed", agent_id="stall-1", task=task, error=error)
    await emit(broker, event_for(task, "routed", agent_id="stall-1"))  # as it was
    await emit(broker, stale, sender="stall-1")
    await _until_looked_at_again(broker, broker.names.coordinator_outcomes)
    done = msgspec.structs.replace(running, state="done", result={"ran": "once"})
    await records.update(key, done, last=revision)
    answered = await watcher.event("answered_from_record", message_id="stalled-1")
    assert answered.agent_id == "stall-1"
    assert watcher.count("retry_scheduled", {"stalled-1"}) == 0


async def test_a_message_sent_again_while_it_runs_never_runs_on_a_second_agent(
    broker, coordinator, watcher
):
    """The same message id twice while one agent runs it (two agents serve the topic): the
    second waits for the first run, is answered from its record, and runs nowhere."""
    runs: Counter[str] = Counter()
    first, second = flaky_agent(runs), Agent("flaky-2", startup_delay=0)
    second.handlers = first.handlers  # the same handlers under another identity
    task = envelopes.Task(
        v=1,
        message_id="both-1",
        trace_id="both-1",
        topic="slow",
        payload={"beats": 4, "beat_s": 0.1},
    )
    async with first.running(broker=broker), second.running(broker=broker):
        await broker.publish(broker.names.task("slow"), envelopes.encode(task))
        await watcher.event("accepted", message_id="both-1")
        await broker.publish(broker.names.task("slow"), envelopes.encode(task))  # no dedup id
        await watcher.event("answered_from_record", message_id="both-1", timeout=20)
        await _until_consumed(broker, first)
        await _until_consumed(broker, second)
    assert runs["both-1"] == 1
    assert watcher.count("completed", {"both-1"}) == 1


async def test_frozen_agent_is_not_acknowledged_within_the_ack_deadline(broker, coordinator):
    """An agent that is registered but takes nothing: invoke fails at the ack deadline."""
    frozen = AgentCard(agent_id="frozen", intents={"ice": Intent()})
    await put_value(broker, broker.names.agents_bucket, "frozen", envelopes.encode(frozen))
    started = time.monotonic()
    async with ReachClient(broker=broker) as client:
        with pytest.raises(NotAcknowledged, match="within 300 ms"):
            await client.invoke("ice", {}, ack_deadline_ms=300)
    assert time.monotonic() - started < 2.0


async def test_compensation_worker_replays_a_dead_letter_that_then_completes(
    broker, coordinator, watcher
):
    """A rejected task is replayed by a compensation worker to another topic and completes."""
    agent = Agent("careful", startup_delay=0)

    @agent.handler("strict")
    async def strict(ctx: TaskContext, payload: dict) -> dict:
        raise PermanentError("amount above limit")

    @agent.handler("manual_review")
    async def manual_review(ctx: TaskContext, payload: dict) -> dict:
        return {"reviewed": payload["amount"]}

    async def send_to_review(letter: DeadLetter, comp: Compensation) -> None:
        await comp.replay(letter, topic="manual_review")

    worker = CompensationWorker("reviews", send_to_review, reasons=["rejected"], topics=["strict"])
    async with (
        agent.running(broker=broker),
        worker.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        message_id, trace_id = await client.publish("strict", {"amount": 900})
        completed = await watcher.event("completed", topic="manual_review")
        replayed = await watcher.event("replayed", message_id=message_id)
    assert completed.trace_id == trace_id
    assert completed.detail["result"] == {"reviewed": 900}
    assert replayed.detail["replayed_as"] == completed.message_id


async def test_max_deliveries_become_dead_letters(broker, coordinator, watcher):
    """A dispatched message nobody acknowledges, past max_deliver, is dead-lettered first."""
    names = broker.names
    task = envelopes.Task(v=1, message_id="stuck-1", trace_id="stuck-1", topic="slow")
    await _delivered_until_spent(broker, task, "stuck")
    letter = await watcher.dead_letter("retries_exhausted", message_id="stuck-1")
    assert letter.error is not None and letter.error.type == "max_deliveries"
    assert letter.error.message == (
        "delivered 2 times to agent stuck and never acknowledged: each of its processes that"
        " took it died or stalled before finishing, or stopped (a stop hands back what it"
        " holds, for a delivery each) (consumer agent-stuck-p1)"
    )
    assert letter.envelope == task

    async def removed() -> bool:  # only after the dead letter was written: a moment later
        info = await broker.js.stream_info(names.dispatch_stream("P1"))
        return info.state.messages == 0

    await until_true(removed, timeout=10)


async def test_max_deliveries_of_a_task_that_ran_answer_from_its_record(
    broker, coordinator, watcher
):
    """Past max_deliver, a dispatched task whose run was recorded as done (its agent's
    acknowledgements lost) is answered from that record, not dead-lettered."""
    names = broker.names
    task = envelopes.Task(v=1, message_id="ran-1", trace_id="ran-1", topic="slow")
    await recorded(broker, "ran-1", "acks-lost", "done", result={"ok": 1})
    await _delivered_until_spent(broker, task, "acks-lost")
    answered = await watcher.event("answered_from_record", message_id="ran-1")
    assert answered.agent_id == "acks-lost"
    assert not [letter for letter in watcher.dead_letters if letter.message_id == "ran-1"]
    info = await broker.js.stream_info(names.dispatch_stream("P1"))
    assert info.state.messages == 0


async def test_agent_killed_mid_task_completes_after_restart_once(
    broker, coordinator, watcher, tmp_path
):
    """kill -9 during a task: after a restart it completes, and its side effect happens once;
    the second run is told it resumes a run that began (``ctx.resumed``), the first is not."""
    log = tmp_path / "side_effects.log"
    start = reach_argv(broker, "agent", "tests.e2e.victim:agent")
    env = {**os.environ, "VICTIM_LOG": str(log)}
    first = await asyncio.create_subprocess_exec(
        *start, cwd=REPO, env=env, stderr=asyncio.subprocess.DEVNULL
    )
    await wait_for_card(broker, "victim", status="running")
    async with ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("slow_write", {})
    await watcher.event("progress", message_id=message_id)
    first.send_signal(signal.SIGKILL)
    await first.wait()
    assert log.read_text() == "start False\n"
    second = await asyncio.create_subprocess_exec(
        *start, cwd=REPO, env=env, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        completed = await watcher.event("completed", message_id=message_id, timeout=20)
    finally:
        second.send_signal(signal.SIGINT)
        await second.wait()
    assert completed.detail["result"] == {"written": True}
    assert log.read_text() == "start False\nstart True\ndone\n"
    # Both processes took the attempt, and the trace says so (one `accepted` each).
    traced = await run(*reach_argv(broker, "trace", message_id))
    assert traced.returncode == 0, traced.stderr
    accepted = [line for line in traced.stdout.splitlines() if "accepted" in line]
    assert len(accepted) == 2, traced.stdout
    epochs = [int(line.rsplit("epoch ", 1)[1]) for line in accepted]
    assert epochs[1] > epochs[0] > 0, traced.stdout


async def _delivered_until_spent(broker, task: envelopes.Task, agent_id: str) -> None:  # type: ignore[no-untyped-def]
    """Dispatch ``task`` to ``agent_id``, whose consumer (max_deliver 2) never acknowledges:
    delivered twice, then given up on by the server (the max-deliveries advisory)."""
    names = broker.names
    spec = ConsumerSpec(
        stream=names.dispatch_stream("P1"),
        durable=f"agent-{agent_id}-p1",
        filter_subjects=(names.dispatch(agent_id, "P1"),),
        ack_wait_s=0.2,
        max_deliver=2,
    )
    consumer = await bind(broker, spec)
    await broker.publish(names.dispatch(agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED)
    for _ in range(3):  # delivered twice, never acknowledged; the third pull finds it spent
        await consumer.fetch(1, wait_s=1)


async def _until_looked_at_again(broker, consumer: str) -> None:  # type: ignore[no-untyped-def]
    """Until ``consumer`` on the events stream handled a message once and got it again."""
    stream = broker.names.events_stream
    async with asyncio.timeout(10):
        while True:
            if (await broker.js.consumer_info(stream, consumer)).num_redelivered:
                return
            await asyncio.sleep(0.05)  # polling the consumer's state: there is no event for it


def _slow_task_for(agent: Agent, message_id: str, **fields: Any) -> envelopes.Task:
    """A ``slow`` task (without beats unless ``payload`` says), as the coordinator
    dispatches it to ``agent``."""
    fields.setdefault("payload", {})
    return envelopes.Task(
        v=1,
        message_id=message_id,
        trace_id=message_id,
        topic="slow",
        to_agent=agent.agent_id,
        **fields,
    )


async def _until_consumed(broker, agent: Agent) -> None:
    """Wait until the agent acknowledged everything dispatched to it (bounded)."""
    stream = broker.names.dispatch_stream("P1")
    consumer = broker.names.agent_consumer(agent.agent_id, "P1")
    async with asyncio.timeout(10):
        while True:
            info = await broker.js.consumer_info(stream, consumer)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.05)  # polling the consumer's state: there is no event for it


async def test_a_compensation_slower_than_the_ack_wait_runs_once_per_dead_letter(broker):
    """A handler may take longer than the worker's ack wait (a refund through a slow bank),
    and dead letters fetched together wait for each other: none is delivered again (to
    this worker or another) while it is held, so none is compensated twice."""
    calls: Counter[str] = Counter()

    async def slow_refund(letter: DeadLetter, comp: Compensation) -> None:
        calls[letter.message_id] += 1
        await asyncio.sleep(0.5)  # the refund itself: longer than the ack wait

    ids = [f"slow-refund-{n}" for n in range(3)]
    for message_id in ids:
        await dead_letter(
            broker, reason="expired", message_id=message_id, trace_id=message_id, topic="refund"
        )
    worker = CompensationWorker("slow-refunds", slow_refund, ack_wait=0.3)
    other = CompensationWorker("slow-refunds", slow_refund, ack_wait=0.3)
    async with worker.running(broker=broker), other.running(broker=broker):

        async def all_settled() -> bool:
            durable = "compensation-slow-refunds"
            state = await consumer_state(broker, broker.names.dlq_stream, durable)
            return state is not None and state.num_pending == state.num_ack_pending == 0

        await until_true(all_settled, timeout=20.0)
    assert calls == Counter(dict.fromkeys(ids, 1))


async def test_a_replay_runs_on_a_fresh_budget(broker, watcher):
    """A dead letter of a caller that waited 300 ms: its replay has no caller waiting, so it
    gets the default budget, not the first caller's patience (a handler of 2 s would be cut
    at 300 ms again, three times, and end as retries_exhausted)."""
    from agentreach.agents.letters import replay

    hurried = envelopes.Task(
        v=1,
        message_id="hurried-1",
        trace_id="hurried-1",
        topic="slow",
        ttl_ms=300,
        budget=envelopes.Budget(ack_ms=100, execute_ms=300),
    )
    letter = await dead_letter(
        broker,
        reason="expired",
        task=hurried,
        message_id="hurried-1",
        trace_id="hurried-1",
        topic="slow",
    )
    again = await replay(broker, letter)
    stored = await read_stream(broker, broker.names.tasks_stream, broker.names.task("slow"))
    sent = envelopes.decode_task(stored[-1].data)
    assert sent.message_id == again.message_id and sent.replay_of == "hurried-1"
    assert sent.budget == envelopes.Budget()
    assert sent.ttl_ms == envelopes.DEFAULT_TTL_MS


async def test_a_failure_reported_by_an_agent_it_was_not_routed_to_ends_nothing(
    broker, coordinator, watcher
):
    """A lying agent published `failed` about a task waiting in another agent's queue (a
    red team, on an open server): not retryable, it dead-lettered the task and told its
    caller it was refused, and the task then ran anyway; retryable, it was retried on a
    second agent while the first still held it (it ran twice). Where no grant can vouch for
    an outcome, the routing does: the lie raises an impersonation alert and changes nothing."""
    release = asyncio.Event()
    holder = Agent("holder-1", startup_delay=0)

    @holder.handler("held", capacity=1)
    async def held(ctx: TaskContext, payload: dict) -> dict:
        await release.wait()
        return payload

    async with holder.running(broker=broker), ReachClient(broker=broker, name="alice") as alice:
        busy = asyncio.create_task(alice.invoke("held", {"n": 0}, ack_deadline_ms=20_000))
        await watcher.event("accepted", topic="held")
        budget = envelopes.Budget(ack_ms=20_000)
        victim = alice.task("held", {"n": 1}, message_id="victim-1", budget=budget)
        waiting = asyncio.create_task(alice.invoke_task(victim))
        await watcher.event("routed", message_id="victim-1")
        dispatched = msgspec.structs.replace(victim, caller="alice", to_agent="holder-1")
        error = {"type": "PermanentError", "message": "forged", "retryable": False}
        lie = event_for(dispatched, "failed", agent_id="liar-1", task=dispatched, error=error)
        subject = broker.names.event("failed", "held", "victim-1", "victim-1", "liar-1")
        await broker.publish(subject, envelopes.encode(lie), headers={"Reach-Kind": "event"})
        alert = await watcher.event("alert", timeout=20)
        release.set()
        assert await busy == {"n": 0}
        assert await waiting == {"n": 1}
    assert alert.detail["problem"] == "impersonation"
    assert watcher.count("dead_lettered", {"victim-1"}) == 0
    assert watcher.count("retry_scheduled", {"victim-1"}) == 0
