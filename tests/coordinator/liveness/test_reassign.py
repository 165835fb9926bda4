"""Reassigning the tasks of an agent that went OFFLINE, on a real server."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, TaskContext
from agentreach.broker import BrokerError, Topology, provision, read_stream
from agentreach.broker.lifecycle import GRANT_HEADER, emit, event_for
from agentreach.broker.limits import StorageLimits
from agentreach.broker.streams import delete_message, next_message
from agentreach.coordinator.delivery.expiry import fence_expiry
from agentreach.coordinator.liveness import reassign
from agentreach.coordinator.liveness.forward import MOVED_MIN_LEFT_MS, STOPPED
from agentreach.coordinator.liveness.reassign import DRAINING, FORGOTTEN, Moves, reassign_tasks
from agentreach.coordinator.observability import MetricsConfig
from agentreach.coordinator.protection.grants import Grants
from agentreach.coordinator.routing.run_once import RunOnce
from tests.conftest import FAST
from tests.scrape import scrape, total
from tests.support import DISPATCHED, events_settled, recorded


async def _queued(broker, message_id: str, agent_id: str) -> envelopes.Task:  # type: ignore[no-untyped-def]
    """A task past its ttl of 200 ms, still in ``agent_id``'s dispatch stream."""
    task = envelopes.Task(
        v=1, message_id=message_id, trace_id=message_id, topic="slow", ttl_ms=200, to_agent=agent_id
    )
    await broker.publish(
        broker.names.dispatch(agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    await asyncio.sleep(0.25)  # the passing of the ttl is what these tests are about
    return task


async def test_a_task_past_its_ttl_in_a_gone_agents_queue_is_dead_lettered_as_expired(
    broker, watcher
):
    await _queued(broker, "stale-q-1", "gone-1")
    assert await reassign_tasks(broker, "gone-1") == 1
    letter = await watcher.dead_letter("expired", message_id="stale-q-1")
    assert letter.error is not None and "gone-1, which went OFFLINE" in letter.error.message


async def test_a_task_with_too_little_ttl_left_to_move_ends_with_its_gone_agent(broker, watcher):
    """A task with 5 ms of its ttl left was moved on, and expired in a peer's queue, its
    letter saying that peer "did not take it" (a drill). Less than MOVED_MIN_LEFT_MS left,
    it ends as expired at the move, with the agent it was with."""
    ttl_ms = MOVED_MIN_LEFT_MS - 10  # moved at once: some of it is left, not enough
    task = envelopes.Task(
        v=1, message_id="nearly-1", trace_id="nearly-1", topic="slow", ttl_ms=ttl_ms
    )
    await broker.publish(
        broker.names.dispatch("gone-2", "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    assert await reassign_tasks(broker, "gone-2") == 1
    letter = await watcher.dead_letter("expired", message_id="nearly-1")
    assert letter.error is not None and "gone-2, which went OFFLINE" in letter.error.message
    assert not [e for e in watcher.events if e.event == "retry_scheduled"]


async def test_what_is_no_task_in_a_gone_agents_queue_is_dead_lettered_not_dropped(broker, watcher):
    """Bytes that are no task in the queue of an agent nobody serves (`nats pub
    reach.agent.nobody.p1 garbage`) are dead-lettered as invalid_envelope, with the bytes
    and the subject, not deleted without a trace."""
    subject = broker.names.dispatch("nobody-1", "P1")
    await broker.publish(subject, b"x-garbage")
    assert await reassign_tasks(broker, "nobody-1", why=FORGOTTEN) == 1
    letter = await watcher.dead_letter("invalid_envelope", topic=envelopes.INVALID_TOPIC)
    assert letter.raw == "x-garbage"
    assert letter.headers["Reach-Subject"] == subject
    assert letter.error is not None
    assert letter.error.message.startswith("a dispatch to nobody-1, which is no longer registered")
    stream = broker.names.dispatch_stream("P1")
    assert await next_message(broker, stream, subject, from_seq=1) is None


async def test_a_task_the_gone_agent_finished_is_answered_from_its_record_and_ends(broker, watcher):
    """The agent ran it and recorded its result, but its acknowledgement was lost (a server
    failing over), so the task was still queued when the agent went: it is answered from
    that record, not dead-lettered as expired."""
    await _queued(broker, "done-q-1", "gone-2")
    await recorded(
        broker, "done-q-1", "gone-2", "done", finished_at_ms=envelopes.now_ms(), result={"ok": True}
    )
    assert await reassign_tasks(broker, "gone-2") == 1
    answered = await watcher.event("answered_from_record", message_id="done-q-1")
    assert answered.agent_id == "gone-2"
    assert not [letter for letter in watcher.dead_letters if letter.message_id == "done-q-1"]
    # It never said `completed` (it died): said for it, so that the message ends (an audit
    # record, counted finished).
    completed = await watcher.event("completed", message_id="done-q-1")
    assert completed.agent_id == "gone-2" and completed.detail["from_record"] is True
    assert completed.detail["result"] == {"ok": True}


async def test_a_task_past_its_ttl_that_a_newer_process_of_the_agent_runs_stays_queued(
    broker, watcher
):
    """The agent's old process (epoch 1) went OFFLINE while its new one (epoch 2, not yet
    registered) had already taken the task: nothing is dead-lettered, and the message stays
    in the queue for that run to acknowledge (deleted, a crash of the run would lose it)."""
    await _queued(broker, "newer-1", "restarted-1")
    await recorded(
        broker,
        "newer-1",
        "restarted-1",
        "running",
        epoch=2,
        lease_until_ms=envelopes.now_ms() + 60_000,
    )
    assert await reassign_tasks(broker, "restarted-1", epoch=1) == 0
    names = broker.names
    queued = await next_message(
        broker, names.dispatch_stream("P1"), names.dispatch("restarted-1", "P1")
    )
    assert queued is not None and envelopes.decode_task(queued.data).message_id == "newer-1"
    assert not watcher.dead_letters


async def test_a_task_a_newer_process_of_the_agent_runs_is_neither_fenced_nor_sent_on(
    broker, watcher
):
    """The old process (epoch 1) is judged gone while its new one (epoch 2) runs a task of
    the queue, within its ttl: the run stands, and no next attempt runs beside it (the new
    process registered while the queue was gone through: a chaos run ran it twice)."""
    task = await _in_gone_queue(broker, "newer-run", "restarted-2", 1, running=False)
    now = envelopes.now_ms()
    await recorded(
        broker, task.message_id, "restarted-2", "running", epoch=2, started_ms=now,
        lease_until_ms=now + 60_000,
    )  # fmt: skip
    assert await reassign_tasks(broker, "restarted-2", epoch=1) == 0
    names = broker.names
    [kept] = await read_stream(
        broker, names.dispatch_stream("P1"), names.dispatch("restarted-2", "P1")
    )
    assert envelopes.decode_task(kept.data).message_id == "newer-run"
    assert not await read_stream(broker, names.tasks_stream, names.coordinator_task("slow"))
    run = await _record(broker, "newer-run", "restarted-2")
    assert (run.state, run.epoch) == ("running", 2)


async def test_a_late_failure_of_an_attempt_taken_from_its_agent_starts_no_retry(
    broker, coordinator, watcher
):
    """The agent of attempt 1 was judged OFFLINE (it was frozen) and its task reassigned as
    attempt 2; when it wakes up, its handler's failure of attempt 1 is reported (as the
    protocol asks). That report must not start a retry of its own: it would be a second
    attempt 2, and answer the caller twice."""
    task = await _queued(broker, "late-fail-1", "frozen-1")
    await recorded(
        broker, "late-fail-1", "frozen-1", "running", lease_until_ms=envelopes.now_ms() + 60_000
    )
    assert await reassign_tasks(broker, "frozen-1") == 1  # past its ttl: expired, fenced
    error = envelopes.ErrorInfo(type="deadline_exceeded", message="handler ran past 500 ms")
    late = event_for(task, "failed", agent_id="frozen-1", task=task, error=error)
    await emit(broker, late, sender="frozen-1")
    await events_settled(broker, broker.names.coordinator_outcomes)
    assert watcher.count("retry_scheduled", {"late-fail-1"}) == 0
    assert [letter.reason for letter in watcher.dead_letters] == ["expired"]  # the reassignment's


async def test_a_reassigned_task_is_not_counted_as_received_again(
    broker, start_coordinator, watcher
):
    """A reassignment goes through intake again as attempt 2: the flow metric of tasks taken
    in counts the task once, at its first attempt, not again."""
    config = msgspec.structs.replace(FAST, metrics=MetricsConfig(port=0))
    async with start_coordinator(config) as coordinator:
        task = envelopes.Task(
            v=1, message_id="moved-1", trace_id="moved-1", topic="slow", attempt=1, ttl_ms=60_000
        )
        await broker.publish(
            broker.names.dispatch("gone-4", "P1"), envelopes.encode(task), headers=DISPATCHED
        )
        assert await reassign_tasks(broker, "gone-4") == 1
        await watcher.dead_letter("no_route", message_id="moved-1")  # intake had it: nobody serves
        scraped = await scrape(coordinator.metrics_url)
    assert total(scraped, "reach_tasks_received_total") == 0


async def test_a_reassignment_the_intake_refuses_is_tried_again_until_it_goes_through(broker):
    """The gone agent's task cannot go back through intake yet (its topic's subject is full):
    the task stays in the queue, nothing raises into the sweep, and the next try, once there
    is room, moves it. A refused write used to end the liveness sweep for good."""
    names = broker.names
    await provision(broker, Topology.default(names, limits=StorageLimits(tasks_per_subject=1)))
    waiting = envelopes.Task(v=1, message_id="in-intake-1", trace_id="in-intake-1", topic="busy")
    # The coordinator's own subject of the topic is full (a mass reassignment, say).
    await broker.publish(
        names.coordinator_task("busy"), envelopes.encode(waiting), headers=DISPATCHED
    )
    queued = envelopes.Task(
        v=1, message_id="queued-1", trace_id="queued-1", topic="busy", to_agent="gone-5"
    )
    await broker.publish(
        names.dispatch("gone-5", "P1"), envelopes.encode(queued), headers=DISPATCHED
    )
    moves = Moves(broker, RunOnce(broker))
    await moves.move("gone-5", epoch=1)
    assert moves.unmoved == {"gone-5"}
    stream = names.dispatch_stream("P1")
    assert await next_message(broker, stream, names.dispatch("gone-5", "P1")) is not None
    intake = await read_stream(broker, names.tasks_stream, names.coordinator_task("busy"))
    await delete_message(broker, names.tasks_stream, intake[0].stream_seq)  # room again
    await moves.retry(lambda agent_id: True)
    assert moves.unmoved == frozenset()
    assert await next_message(broker, stream, names.dispatch("gone-5", "P1")) is None
    [moved] = await read_stream(broker, names.tasks_stream, names.coordinator_task("busy"))
    retry = envelopes.decode_task(moved.data)
    assert (retry.message_id, retry.attempt) == ("queued-1", 2)


async def test_a_reassignment_of_an_agent_back_online_is_not_tried_again(broker):
    names = broker.names
    await provision(broker, Topology.default(names, limits=StorageLimits(tasks_per_subject=1)))
    await broker.publish(
        names.coordinator_task("busy"),
        envelopes.encode(envelopes.Task(v=1, message_id="w-2", trace_id="w-2", topic="busy")),
        headers=DISPATCHED,
    )
    queued = envelopes.Task(v=1, message_id="q-2", trace_id="q-2", topic="busy", to_agent="back")
    await broker.publish(names.dispatch("back", "P1"), envelopes.encode(queued), headers=DISPATCHED)
    moves = Moves(broker, RunOnce(broker))
    await moves.move("back", epoch=1)
    await moves.retry(lambda agent_id: False)  # it came back: its consumer takes its queue
    assert moves.unmoved == frozenset()
    stream = names.dispatch_stream("P1")
    assert await next_message(broker, stream, names.dispatch("back", "P1")) is not None


async def test_a_reassignment_refused_until_its_ttl_passed_ends_as_expired(broker, watcher):
    """While the coordinator's own intake subject of its topic stays full, the gone agent's
    task is tried at every sweep; the first try after its ttl dead-letters it as expired,
    naming the agent, and nothing is left to try."""
    names = broker.names
    await provision(broker, Topology.default(names, limits=StorageLimits(tasks_per_subject=1)))
    full = envelopes.Task(v=1, message_id="f-3", trace_id="f-3", topic="busy")
    await broker.publish(names.coordinator_task("busy"), envelopes.encode(full), headers=DISPATCHED)
    queued = envelopes.Task(
        v=1, message_id="q-3", trace_id="q-3", topic="busy", to_agent="gone-6", ttl_ms=500
    )
    await broker.publish(
        names.dispatch("gone-6", "P1"), envelopes.encode(queued), headers=DISPATCHED
    )
    moves = Moves(broker, RunOnce(broker))
    await moves.move("gone-6", epoch=1)
    assert moves.unmoved == {"gone-6"}
    await asyncio.sleep(0.6)  # the passing of the ttl is what this test is about
    await moves.retry(lambda agent_id: True)
    letter = await watcher.dead_letter("expired", message_id="q-3")
    assert letter.error is not None and "gone-6, which went OFFLINE" in letter.error.message
    assert moves.unmoved == frozenset()
    assert (
        await next_message(broker, names.dispatch_stream("P1"), names.dispatch("gone-6", "P1"))
        is None
    )


async def test_a_task_moved_before_its_agent_claimed_it_is_fenced_for_that_agent(broker):
    """A queued attempt its agent never claimed is moved on as attempt 2 with a fence in the
    gone agent's record: a process of it that came back and fetched attempt 1 from its
    durable queue before the move deleted it ran it beside attempt 2 (the chaos suite)."""
    task = envelopes.Task(
        v=1, message_id="moved-2", trace_id="moved-2", topic="slow", ttl_ms=60_000, caller="al"
    )
    await broker.publish(
        broker.names.dispatch("gone-5", "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    assert await reassign_tasks(broker, "gone-5", epoch=3) == 1
    [record] = await RunOnce(broker).records(task)
    assert (record.agent_id, record.attempt, record.state) == ("gone-5", 1, "failed")
    assert envelopes.is_reassignment_fence(record, 1)
    assert not envelopes.is_reassignment_fence(record, 2)  # the next attempt may run anywhere


async def _in_gone_queue(broker, message_id: str, agent_id: str, attempt: int, *, running: bool):  # type: ignore[no-untyped-def]
    """Attempt ``attempt`` of a task in ``agent_id``'s queue; ``running``: its agent's record
    says it claimed it (its run began a moment ago)."""
    task = envelopes.Task(
        v=1, message_id=message_id, trace_id=message_id, topic="slow", attempt=attempt,
        ttl_ms=60_000,
    )  # fmt: skip
    await broker.publish(
        broker.names.dispatch(agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    if running:
        now = envelopes.now_ms()
        await recorded(
            broker, message_id, agent_id, "running", attempt=attempt, started_ms=now,
            lease_until_ms=now + 60_000,
        )  # fmt: skip
    return task


async def _moved(broker) -> envelopes.Task:  # type: ignore[no-untyped-def]
    """The one task a reassignment sent back through the coordinator's intake subject."""
    [moved] = await read_stream(
        broker, broker.names.tasks_stream, broker.names.coordinator_task("slow")
    )
    return envelopes.decode_task(moved.data)


async def test_an_attempt_moved_before_it_ran_costs_none_of_the_topics_attempts(broker, watcher):
    """The gone agent never claimed attempt 3 (of the 3 a topic gets): it did not run, so it
    is moved on as attempt 4 with ``requeued`` 1, and the trace says it had not run. A
    rolling restart must not use up a task's attempts."""
    await _in_gone_queue(broker, "unrun-1", "gone-7", 3, running=False)
    assert await reassign_tasks(broker, "gone-7") == 1
    retry = await _moved(broker)
    assert (retry.attempt, retry.requeued) == (4, 1)
    scheduled = await watcher.event("retry_scheduled", message_id="unrun-1")
    assert scheduled.detail["error"]["message"] == "gone-7 went OFFLINE before it ran"
    assert not watcher.dead_letters


async def test_two_callers_tasks_under_one_id_are_both_moved_on(broker):
    """mallory's own task under alice's id, moved from her queue, went back through intake
    under the id alice's would take when her agent went too: the stream dropped alice's as
    its duplicate, and her task never ran nor ended (a security re-test)."""
    for caller, agent in (("mallory", "gone-m"), ("alice", "gone-a")):
        task = envelopes.Task(
            v=1, message_id="order-42", trace_id="order-42", topic="slow", caller=caller,
            ttl_ms=60_000,
        )  # fmt: skip
        queue = broker.names.dispatch(agent, "P1")
        await broker.publish(queue, envelopes.encode(task), headers=DISPATCHED)
        assert await reassign_tasks(broker, agent) == 1
    stored = await read_stream(
        broker, broker.names.tasks_stream, broker.names.coordinator_task("slow")
    )
    assert sorted(envelopes.decode_task(m.data).caller for m in stored) == ["alice", "mallory"]


async def test_an_agent_lost_while_running_the_last_attempt_ends_the_task(broker, watcher):
    """A task that kills every agent that runs it: its agent went away while running its
    last allowed attempt, so it ends as ``retries_exhausted`` naming the agent, instead of
    being moved on to take down the next agent until its ttl runs out."""
    await _in_gone_queue(broker, "poison-1", "gone-8", 3, running=True)
    assert await reassign_tasks(broker, "gone-8") == 1
    letter = await watcher.dead_letter("retries_exhausted", message_id="poison-1")
    assert letter.attempts == 3
    assert letter.error is not None and letter.error.type == "reassigned"
    assert not letter.error.retryable  # sent again, it would take down more agents
    assert letter.error.message == (
        "gone-8 went OFFLINE while running attempt 3; 3 of the 3 attempts allowed ran"
    )
    intake = broker.names.coordinator_task("slow")
    assert await read_stream(broker, broker.names.tasks_stream, intake) == []


async def test_an_attempt_ended_unreported_is_not_sent_on_when_its_agent_goes(broker, watcher):
    """A paused agent's attempt, never acknowledged nor reported in time, was ended as
    `expired` (its expiry fence written, the task dead-lettered); its dispatch still waits
    in that agent's queue. When the agent goes OFFLINE the dispatch is dropped, not moved
    on: moved, the task ran again and was dead-lettered a second time."""
    await _in_gone_queue(broker, "ended-1", "gone-12", 1, running=False)
    began = envelopes.now_ms() - 60_000  # its lease lapsed: the process is paused
    await recorded(broker, "ended-1", "gone-12", "running", started_ms=began, lease_until_ms=began)
    task = envelopes.Task(v=1, message_id="ended-1", trace_id="ended-1", topic="slow")
    error = envelopes.ErrorInfo(type="expired", message="never reported", retryable=False)
    assert await fence_expiry(broker, task, "gone-12", error, seal=None) == "end"
    assert await reassign_tasks(broker, "gone-12") == 1
    intake = broker.names.coordinator_task("slow")
    assert await read_stream(broker, broker.names.tasks_stream, intake) == []
    queue = broker.names.dispatch("gone-12", "P1")
    assert await next_message(broker, broker.names.dispatch_streams["P1"], queue) is None
    assert watcher.count("retry_scheduled", {"ended-1"}) == 0


async def test_a_run_cut_by_its_agents_clean_stop_costs_none_of_the_topics_attempts(
    broker, watcher
):
    """The agent stopped cleanly with the last attempt still running (past its drain time):
    that run failed for the stop, not for the task, so the task moves on uncounted."""
    await _in_gone_queue(broker, "cut-1", "gone-11", 3, running=True)
    assert await reassign_tasks(broker, "gone-11", why=STOPPED) == 1
    retry = await _moved(broker)
    assert (retry.attempt, retry.requeued) == (4, 1)
    scheduled = await watcher.event("retry_scheduled", message_id="cut-1")
    assert scheduled.detail["error"]["message"] == "gone-11 stopped while running it"
    assert not watcher.dead_letters


async def test_a_draining_agent_keeps_what_it_runs_and_loses_what_it_never_claimed(broker, watcher):
    """Its card says draining: the run it claimed finishes there (its message stays in the
    queue for its ack); the task it never claimed moves on now, uncounted, and the fence
    keeps the agent from starting it after all."""
    await _in_gone_queue(broker, "draining-run", "drains-1", 1, running=True)
    await _in_gone_queue(broker, "draining-wait", "drains-1", 1, running=False)
    assert await reassign_tasks(broker, "drains-1", epoch=1, why=DRAINING) == 1
    retry = await _moved(broker)
    assert (retry.message_id, retry.attempt, retry.requeued) == ("draining-wait", 2, 1)
    scheduled = await watcher.event("retry_scheduled", message_id="draining-wait")
    assert scheduled.detail["error"]["message"] == "drains-1 began to stop before it ran"
    stream, subject = broker.names.dispatch_stream("P1"), broker.names.dispatch("drains-1", "P1")
    [kept] = await read_stream(broker, stream, subject)
    assert envelopes.decode_task(kept.data).message_id == "draining-run"
    fence = await _record(broker, "draining-wait", "drains-1")
    assert envelopes.is_reassignment_fence(fence, 1)
    run = await _record(broker, "draining-run", "drains-1")
    assert run.state == "running"


async def _record(broker, message_id: str, agent_id: str) -> envelopes.Execution:  # type: ignore[no-untyped-def]
    records = await broker.bucket(broker.names.executions_bucket, envelopes.Execution)
    entry = await records.get(envelopes.execution_key(None, message_id, agent_id))
    assert entry is not None
    return entry.value


async def test_an_agent_lost_while_running_an_earlier_attempt_counts_it(broker, watcher):
    await _in_gone_queue(broker, "lost-1", "gone-9", 2, running=True)
    assert await reassign_tasks(broker, "gone-9") == 1
    retry = await _moved(broker)
    assert (retry.attempt, retry.requeued) == (3, 0)
    scheduled = await watcher.event("retry_scheduled", message_id="lost-1")
    assert scheduled.detail["error"]["message"] == "gone-9 went OFFLINE while running it"


async def test_a_task_moved_unrun_still_gets_every_attempt_of_its_topic(
    broker, coordinator, watcher
):
    """Through the coordinator: attempt 1 waited in the queue of an agent that went away
    without claiming it; moved on, the task still runs the 5 attempts its intent allows (it
    ran 4 when the move counted as one of them)."""
    runs: Counter[int] = Counter()
    agent = Agent("hopeless-1", startup_delay=0)

    @agent.handler("hopeless", max_attempts=5)
    async def hopeless(ctx: TaskContext, payload: object) -> object:
        runs[ctx.attempt] += 1
        raise ConnectionError("still down")

    inbox = broker.names.reply_box("test", "unrun-2")
    replies = await broker.nc.subscribe(f"{inbox}.>")
    task = envelopes.Task(
        v=1, message_id="unrun-2", trace_id="unrun-2", topic="hopeless", reply_to=inbox
    )
    async with agent.running(broker=broker):
        await broker.publish(
            broker.names.dispatch("gone-10", "P1"), envelopes.encode(task), headers=DISPATCHED
        )
        assert await reassign_tasks(broker, "gone-10") == 1
        letter = await watcher.dead_letter("retries_exhausted", message_id="unrun-2", timeout=30)
        ended = await watcher.event("dead_lettered", message_id="unrun-2")
        error = await _error_reply(replies)
    assert sorted(runs) == [2, 3, 4, 5, 6] and set(runs.values()) == {1}
    assert letter.attempts == 5 and letter.envelope.attempt == 6  # five ran; one moved unrun
    assert (error.attempts, error.attempt) == (5, 6)  # `reach publish` said "after 6 attempts"
    assert ended.detail["attempts"] == 5


async def _error_reply(replies) -> envelopes.ErrorReply:  # type: ignore[no-untyped-def]
    """The first ``error`` among the replies ``replies`` receives (acks come before it)."""
    async with asyncio.timeout(10):
        while True:
            reply = envelopes.decode((await replies.next_msg(timeout=10)).data)
            if isinstance(reply, envelopes.ErrorReply):
                return reply


async def test_a_sweep_stops_once_a_newer_process_of_the_agent_serves_its_queue(
    broker, monkeypatch
):
    """A dead process's queue of 341 tasks took 7 s to go through, and a process of the agent
    that started meanwhile had the tasks routed to it moved away too, to and fro, one attempt
    after another (a cluster walkthrough: attempt 9, three completions). The sweep asks again
    as it goes, and leaves the rest to the newer process's consumer (the same durable)."""
    subject = broker.names.dispatch("gone-9", "P1")
    for n in range(30):
        await _dispatched(broker, "gone-9", f"q-{n}")
    looks: list[int] = []

    async def started_after_the_first_look(broker, agent_id: str, epoch: int) -> bool:  # type: ignore[no-untyped-def]
        looks.append(epoch)
        return len(looks) > 1  # the newer process's card, written while the sweep ran

    monkeypatch.setattr(reassign, "_newer_process", started_after_the_first_look)
    moved = await reassign_tasks(broker, "gone-9", epoch=1)
    left = await read_stream(broker, broker.names.dispatch_stream("P1"), subject)
    assert moved == reassign.NEWER_LOOK_EVERY - 1 and len(looks) == 2
    assert len(left) == 30 - moved  # for the newer process to take


async def test_a_dispatch_stored_after_a_move_began_is_left_to_a_newer_process(broker, monkeypatch):
    """A stop's move sent its task on (attempt 2), the coordinator routed it to the agent's
    next process, into this very queue, and the move, still going through it, took it away
    too, before it ran (attempt 3, then 4: a TypeScript test, one run in three). A dispatch
    stored since the move began is moved only when no newer process serves the agent."""
    subject = broker.names.dispatch("gone-10", "P1")
    for n in range(3):
        await _dispatched(broker, "gone-10", f"old-{n}")
    looks: list[int] = []

    async def routed_to_the_next_process_meanwhile(broker, agent_id: str, epoch: int) -> bool:  # type: ignore[no-untyped-def]
        looks.append(epoch)
        if len(looks) == 1:  # as the move begins: no newer process yet; one starts now
            await _dispatched(broker, "gone-10", "new-0", attempt=2)
            return False
        return True  # its card: running, a newer epoch

    monkeypatch.setattr(reassign, "_newer_process", routed_to_the_next_process_meanwhile)
    moved = await reassign_tasks(broker, "gone-10", epoch=1, why=STOPPED)
    left = await read_stream(broker, broker.names.dispatch_stream("P1"), subject)
    assert moved == 3 and len(looks) == 2
    assert [envelopes.decode_task(m.data).message_id for m in left] == ["new-0"]


async def _dispatched(broker, agent_id: str, message_id: str, *, attempt: int = 1) -> None:  # type: ignore[no-untyped-def]
    """A task in ``agent_id``'s P1 queue, its ttl far off."""
    task = envelopes.Task(v=1, message_id=message_id, trace_id=message_id, topic="slow",
                          attempt=attempt, ttl_ms=60_000, to_agent=agent_id)  # fmt: skip
    await broker.publish(
        broker.names.dispatch(agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED
    )


async def test_a_dispatch_without_the_coordinator_s_grant_is_not_moved_on(broker, watcher):
    """With a seal key every dispatch carries the coordinator's grant for its agent. A task
    someone had the server copy onto an agent's queue carries none: moved on, it was the
    coordinator's own task in another caller's name (caller alice, a reply box of the
    forger's), answered from alice's record or run as hers. It is dead-lettered instead."""
    grants = Grants(b"k" * 32)
    forged = envelopes.Task(
        v=1, message_id="order-42", trace_id="order-42", topic="echo", caller="alice",
        attempt=2, reply_to=broker.names.reply_box("mallory", "loot"), to_agent="mallory",
    )  # fmt: skip
    granted = msgspec.structs.replace(forged, message_id="granted-1", trace_id="granted-1")
    queue = broker.names.dispatch("mallory", "P1")
    await broker.publish(queue, envelopes.encode(forged), headers=DISPATCHED)
    grant = {GRANT_HEADER: grants.sign(granted, "mallory") or ""}
    await broker.publish(queue, envelopes.encode(granted), headers={**DISPATCHED, **grant})
    run_once = RunOnce(broker, grants)
    assert await reassign_tasks(broker, "mallory", why=FORGOTTEN, run_once=run_once) == 2
    letter = await watcher.dead_letter("invalid_envelope", topic=envelopes.INVALID_TOPIC)
    assert letter.error is not None and "no grant of the coordinator's" in letter.error.message
    moved = await watcher.event("retry_scheduled", message_id="granted-1")
    assert moved.message_id == "granted-1"
    assert not [e for e in watcher.events if e.message_id == "order-42"]


async def test_a_move_cut_short_after_its_fence_is_sent_on_when_the_agent_reports_it(
    broker, coordinator, watcher, monkeypatch
):
    """The coordinator fenced gone-10's attempt and died before it sent it on (here: the
    send fails); gone-10 came back, so the move was not tried again, and its new process
    left the fenced attempt, acknowledged: lost (a chaos run). Its report of the attempt
    (`failed`, the fence's error) now sends it on, as the move would have, once; the same
    report of a move that went through sends nothing."""
    task = await _in_gone_queue(broker, "cut-1", "gone-10", 1, running=False)

    async def dying(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise BrokerError("the coordinator died here")

    monkeypatch.setattr(reassign, "forward", dying)
    with pytest.raises(BrokerError):
        await reassign_tasks(broker, "gone-10")
    monkeypatch.undo()
    [fence] = await RunOnce(broker).records(task)
    assert envelopes.is_reassignment_fence(fence, 1)
    cards = await broker.bucket(broker.names.agents_bucket, envelopes.AgentCard)
    await cards.put("gone-10", envelopes.AgentCard(agent_id="gone-10", intents={}, epoch=2))
    await emit(broker, event_for(task, "routed", agent_id="gone-10"))  # as the router did
    report = event_for(task, "failed", agent_id="gone-10", task=task, error=fence.error)
    with capture_logs() as logs:
        await emit(broker, report, sender="gone-10")
        scheduled = await watcher.event("retry_scheduled", message_id="cut-1")
    assert any(line["event"].startswith("a move of the task was cut short") for line in logs)
    assert scheduled.detail["next_attempt"] == 2
    assert (await _moved(broker)).attempt == 2
    await emit(broker, msgspec.structs.replace(report, at_ms=report.at_ms + 1), sender="gone-10")
    await events_settled(broker, broker.names.coordinator_outcomes)
    assert watcher.count("retry_scheduled", {"cut-1"}) == 1  # the move went through now
