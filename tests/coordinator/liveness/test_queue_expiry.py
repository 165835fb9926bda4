"""Tasks past their ttl in the queue of an ONLINE agent that does not take them, on a real
server: the coordinator ends them as expired, once, and never one that an agent runs."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path

import msgspec
import pytest

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, Rejected, TaskContext
from agentreach.agents.runtime import AgentRuntime
from agentreach.broker.lifecycle import emit, event_for
from agentreach.broker.streams import subject_counts
from agentreach.coordinator import CoordinatorConfig, QueueExpiryConfig
from agentreach.coordinator.liveness.queue_expiry import QueueExpiry
from agentreach.coordinator.protection.grants import Grants, SecurityConfig
from agentreach.coordinator.routing.run_once import RunOnce
from agentreach.envelopes import AgentCard, ErrorInfo, Priority, Task, encode
from tests.conftest import FAST
from tests.secured import SecuredDeployment, sealed_deployment
from tests.support import DISPATCHED, Watcher, events_settled, eventually, recorded, until_true

# The queues gone over every 0.1 s, with 0.2 s of grace past a task's ttl.
SWEEPING = msgspec.structs.replace(
    FAST, queue_expiry=QueueExpiryConfig(every_s=0.1, grace_s=0.2, reconnect_grace_s=0)
)
# No pass of its own (the test makes them), and no grace: the race is the test's to arrange.
NO_GRACE = QueueExpiryConfig(every_s=3600, grace_s=0, reconnect_grace_s=0)
BY_HAND = msgspec.structs.replace(FAST, queue_expiry=NO_GRACE)


def _agent(agent_id: str, **handler: object) -> tuple[Agent, asyncio.Event]:
    """An agent whose one handler holds its place until the returned event is set."""
    agent = Agent(agent_id, startup_delay=0, heartbeat_interval=0.5)
    release = asyncio.Event()

    @agent.handler("hold", **handler)  # type: ignore[arg-type]
    async def hold(ctx: TaskContext, payload: object) -> object:
        await release.wait()
        return payload

    return agent, release


async def _never_fetch(self: AgentRuntime, priority: Priority, consumer: object) -> None:
    """A fetch loop stuck for good (the agent beats and answers probes all the same)."""
    await asyncio.Event().wait()


async def _queue_is_empty(broker, agent_id: str) -> bool:  # type: ignore[no-untyped-def]
    names = broker.names
    counts = await subject_counts(
        broker, names.dispatch_stream("P1"), names.dispatch(agent_id, "P1")
    )
    return not counts


async def test_a_task_queued_for_an_agent_that_never_fetches_ends_expired_once(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """An agent that registers and beats but never consumes: a task sent to it with a short
    ttl ends as `expired` in REACH_DLQ, its sender gets the error, once, while the agent is
    still ONLINE — not when it stops."""
    monkeypatch.setattr(AgentRuntime, "_consume", _never_fetch)
    agent, _ = _agent("unfed-1")
    async with (
        start_coordinator(SWEEPING) as coordinator,
        agent.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        started = time.monotonic()
        with pytest.raises(Rejected) as caught:
            await client.invoke("hold", {"n": 1}, ttl_ms=300, ack_deadline_ms=20_000)
        took_s = time.monotonic() - started
        message_id = caught.value.message_id
        letter = await watcher.dead_letter("expired", message_id=message_id)
        assert await coordinator.queue_expiry.sweep() == 0  # nothing left to end
        assert await _queue_is_empty(broker, "unfed-1")
        assert [s.detail["state"] for s in watcher.states("unfed-1")] == ["ONLINE"]
    assert caught.value.reason == "expired" and caught.value.ending == "expired"
    assert caught.value.attempts == letter.attempts == 0  # sent, but it never began
    assert letter.error is not None
    assert letter.error.message.endswith(
        " ms passed in the queue of unfed-1, which did not take it"
    )
    assert [d.message_id for d in watcher.dead_letters] == [message_id]
    assert watcher.count("dead_lettered", {message_id}) == 1
    assert took_s < 0.3 + 0.2 + 0.1 + 2.0  # ttl, grace, a pass, and the slow machine's share


async def test_a_blocked_agent_s_waiting_tasks_end_once_and_its_running_task_completes(
    broker, start_coordinator, watcher
):
    """A handler of capacity 1 holds its place: the tasks behind it end as expired once each
    (the agent expires what it fetches, the coordinator's passes what stays queued: whoever
    comes first), and the task it runs past its ttl and grace is not expired but completes."""
    agent, release = _agent("blocked-1", capacity=1)
    async with (
        start_coordinator(SWEEPING) as coordinator,
        agent.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        running_id, _ = await client.publish("hold", {"n": 0}, ttl_ms=400)
        await watcher.event("accepted", message_id=running_id)
        waiting = {(await client.publish("hold", {"n": n}, ttl_ms=300))[0] for n in range(1, 6)}

        def every_one_ended() -> bool | None:
            ended = {d.message_id for d in watcher.dead_letters} & waiting
            return True if ended == waiting else None

        await watcher.until(every_one_ended, "every waiting task dead-lettered")
        # Past the running task's ttl and grace: a pass looks at it, and leaves it.
        assert await coordinator.queue_expiry.sweep() == 0
        release.set()
        done = await watcher.event("completed", message_id=running_id)
    assert done.agent_id == "blocked-1"
    letters = [d.message_id for d in watcher.dead_letters]
    assert sorted(letters) == sorted(waiting), letters  # once each, and not the running one
    assert all(d.reason == "expired" for d in watcher.dead_letters)
    assert watcher.count("dead_lettered", waiting) == len(waiting)


async def _queued(broker, message_id: str, agent_id: str) -> envelopes.Task:  # type: ignore[no-untyped-def]
    """A task of 100 ms ttl, dispatched to ``agent_id``'s P1 queue, now past its ttl."""
    task = envelopes.Task(
        v=1,
        message_id=message_id,
        trace_id=message_id,
        topic="hold",
        ttl_ms=100,
        to_agent=agent_id,
    )
    await emit(broker, event_for(task, "routed", agent_id=agent_id))  # as the router does
    await broker.publish(
        broker.names.dispatch(agent_id, "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    await asyncio.sleep(0.15)  # the passing of the ttl is what these tests are about
    return task


async def _report_expired(broker, task: envelopes.Task, agent_id: str) -> None:  # type: ignore[no-untyped-def]
    """The agent's own report (§10.4): it fetched the task at the same moment."""
    message = f"ttl {task.ttl_ms} ms passed in the queue of {agent_id}"
    error = ErrorInfo(type="expired", message=message, retryable=False)
    report = event_for(task, "expired", agent_id=agent_id, task=task, error=error)
    await emit(broker, report, sender=agent_id)


async def test_the_sweep_first_then_the_agent_s_report_ends_the_task_once(
    broker, start_coordinator, watcher
):
    """The coordinator ends a queued task as expired; the report of its agent, which fetched
    it at that very moment, arrives after: it is left alone."""
    async with start_coordinator(BY_HAND) as coordinator:
        task = await _queued(broker, "race-1", "racer-1")
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 1
        await _report_expired(broker, task, "racer-1")
        await events_settled(broker, broker.names.coordinator_outcomes)
    assert [d.message_id for d in watcher.dead_letters] == ["race-1"]
    error = watcher.dead_letters[0].error
    assert error is not None and error.message.endswith("which did not take it")


async def test_the_agent_s_report_first_then_the_sweep_ends_the_task_once(
    broker, start_coordinator, watcher
):
    """The agent reports a task expired, and the coordinator's pass finds it still queued
    (the agent's acknowledgement not yet there): the pass only removes the copy."""
    async with start_coordinator(BY_HAND) as coordinator:
        task = await _queued(broker, "race-2", "racer-2")
        await _report_expired(broker, task, "racer-2")
        await watcher.dead_letter("expired", message_id="race-2")
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 0
        assert await _queue_is_empty(broker, "racer-2")
    assert [d.message_id for d in watcher.dead_letters] == ["race-2"]
    error = watcher.dead_letters[0].error
    assert error is not None and error.message == "ttl 100 ms passed in the queue of racer-2"


class _Depths:
    """Queue depths of a fleet, as QueueDepths gives them."""

    def __init__(self, depths: dict[tuple[str, Priority], int]) -> None:
        self.depths = depths

    def slots(self) -> set[tuple[str, Priority]]:
        return set(self.depths)

    def depth(self, agent_id: str, priority: Priority) -> int:
        return self.depths.get((agent_id, priority), 0)


async def test_a_pass_over_100_000_queues_reads_at_most_its_share(broker):
    """100,000 agents with tasks queued: a pass picks at most ``reads`` queues to read, in a
    plain scan (no request per agent; how long it takes is for a bench, not a test)."""
    config = CoordinatorConfig().queue_expiry
    depths = _Depths({(f"agent-{i:06d}", "P1"): 1 + i % 7 for i in range(100_000)})
    expiry = QueueExpiry(broker, config, depths)
    due = expiry.due()  # not a coroutine: no request at all
    assert len(due) == config.reads


async def test_a_queue_read_is_read_again_only_when_it_grows_or_comes_due(broker):
    """A queue whose tasks are far from their ttl is read once, then left until it holds
    more than it did, or its earliest task comes due."""
    names = broker.names
    task = envelopes.Task(v=1, message_id="far-1", trace_id="far-1", topic="hold", ttl_ms=60_000)
    await broker.publish(
        names.dispatch("patient-1", "P1"), envelopes.encode(task), headers=DISPATCHED
    )
    depths = _Depths({("patient-1", "P1"): 1})
    expiry = QueueExpiry(broker, NO_GRACE, depths)
    assert expiry.due() == [("patient-1", "P1")]
    assert await expiry.sweep() == 0
    assert expiry.due() == []  # read: nothing comes due for a minute
    depths.depths[("patient-1", "P1")] = 2  # another task, whose ttl may be shorter
    assert expiry.due() == [("patient-1", "P1")]


async def test_on_a_sealed_deployment_the_fence_is_sealed_and_the_sender_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Secured, with the seal key: the agent (its own creds) never fetches; alice's task ends
    expired, and the fence the coordinator wrote in the agent's record carries the seal of
    that attempt, so every look at the records believes it (no impersonation alert)."""
    monkeypatch.setattr(AgentRuntime, "_consume", _never_fetch)
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "sealed-1", intents=("hold",))
    agent, _ = _agent("sealed-1")
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        agent.running(url, auth=deployment.auth("agent", "sealed-1")),
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
        Watcher(admin) as watcher,
    ):
        grants = Grants.from_config(SecurityConfig(seal_key_file=deployment.seal_key_file))
        expiry = QueueExpiry(coordinator.broker, NO_GRACE, coordinator.queues, grants)
        invoking = asyncio.create_task(
            alice.invoke("hold", {}, message_id="sealed-task", ttl_ms=300, ack_deadline_ms=20_000)
        )
        await watcher.event("routed", message_id="sealed-task")

        async def ended() -> bool:  # by this pass, or by the coordinator's own (2 s of grace)
            await expiry.sweep()
            return invoking.done()

        await until_true(ended)
        with pytest.raises(Rejected) as caught:
            await invoking
        task = envelopes.Task(
            v=1, message_id="sealed-task", trace_id="sealed-task", topic="hold", caller="alice"
        )
        records = await RunOnce(admin, grants).records(task)
    assert caught.value.reason == "expired"
    assert [(r.agent_id, r.state, r.seal is not None) for r in records] == [
        ("sealed-1", "failed", True)
    ]
    assert not [e for e in watcher.events if e.event == "alert"]


async def test_a_task_its_agent_took_and_went_silent_with_is_not_said_untaken(
    broker, start_coordinator, watcher
):
    """Its agent claimed it (a run's record of this attempt, its lease past: killed mid-run)
    and it is still queued past its ttl: the letter says it was taken and may have run in
    part, not that the agent did not take it (a reader would conclude nothing ran)."""
    async with start_coordinator(BY_HAND) as coordinator:
        task = await _queued(broker, "silent-1", "silent-agent")
        await recorded(
            broker, "silent-1", "silent-agent", "running", lease_until_ms=envelopes.now_ms() - 1
        )
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 1
    assert task.attempt == 1
    assert watcher.dead_letters[0].attempts == 1  # it began (not "0: nothing ran")
    error = watcher.dead_letters[0].error
    assert error is not None
    assert error.message == (
        "ttl 100 ms passed in the queue of silent-agent, which took it and went silent (its"
        " run's lease ran out): it may have run in part"
    )


async def test_a_task_its_agent_took_is_left_for_a_grace_after_the_replica_starts(
    broker, start_coordinator, watcher
):
    """Back after a minute's outage, the coordinator ended as `expired` ("went silent")
    within a second a task whose agent had finished it while the server was away and was
    reconnecting to record it: its kept result was then rejected as late. A run whose lease
    lapsed is left for ``reconnect_grace_s`` after the replica's start (or reconnect)."""
    grace = msgspec.structs.replace(NO_GRACE, reconnect_grace_s=1.0)
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    await cards.put("quiet-agent", AgentCard(agent_id="quiet-agent", intents={}))  # registered
    async with start_coordinator(msgspec.structs.replace(FAST, queue_expiry=grace)) as coordinator:
        began = time.monotonic()
        await _queued(broker, "silent-2", "quiet-agent")
        await recorded(
            broker, "silent-2", "quiet-agent", "running", lease_until_ms=envelopes.now_ms() - 1
        )
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 0
        await _queued(broker, "untaken-2", "quiet-agent")  # not taken: no grace for it
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 1
        await asyncio.sleep(1.0 - (time.monotonic() - began))  # the grace passing
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 1  # still silent: ended
    assert [(d.message_id, d.attempts) for d in watcher.dead_letters] == [
        ("untaken-2", 0),
        ("silent-2", 1),
    ]


async def test_a_retry_routed_late_in_its_ttl_that_its_agent_runs_is_not_ended(
    broker, start_coordinator, watcher
):
    """Attempt 2 of a task taken in 100 s ago, dispatched with what was left of its ttl
    (100 ms), runs at its agent under a live lease past that ttl: it is left running. The
    lease was counted only until `received_ms` + the dispatch's ttl + 30 s, long past: the
    run was ended as `expired` ("went silent"), and a replay of its letter ran beside it."""
    task = envelopes.Task(
        v=1,
        message_id="late-retry-1",
        trace_id="late-retry-1",
        topic="hold",
        ttl_ms=100,
        attempt=2,
        to_agent="slow-agent",
        received_ms=envelopes.now_ms() - 100_000,
    )
    async with start_coordinator(BY_HAND) as coordinator:
        await emit(broker, event_for(task, "routed", agent_id="slow-agent"))
        await broker.publish(
            broker.names.dispatch("slow-agent", "P1"), envelopes.encode(task), headers=DISPATCHED
        )
        live = envelopes.now_ms() + 60_000
        await recorded(
            broker, "late-retry-1", "slow-agent", "running", attempt=2, lease_until_ms=live
        )
        await asyncio.sleep(0.15)  # the passing of the dispatch's ttl is what this is about
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 0
    assert watcher.dead_letters == []
    assert not await _queue_is_empty(broker, "slow-agent")


async def test_a_task_dispatched_late_says_its_ttl_was_what_was_left(
    broker, start_coordinator, watcher
):
    """Taken in 88 s before it was dispatched with 100 ms of its ttl left, it ends in the
    agent's queue: the letter says so (it read "ttl 100 ms passed", and an operator blamed a
    caller that had sent 90,000 ms)."""
    task = envelopes.Task(
        v=1,
        message_id="late-sent-1",
        trace_id="late-sent-1",
        topic="hold",
        ttl_ms=100,
        to_agent="idle-agent",
        received_ms=envelopes.now_ms() - 88_000,
    )
    async with start_coordinator(BY_HAND) as coordinator:
        await emit(broker, event_for(task, "routed", agent_id="idle-agent"))
        await broker.publish(
            broker.names.dispatch("idle-agent", "P1"), envelopes.encode(task), headers=DISPATCHED
        )
        await asyncio.sleep(0.15)  # the passing of the dispatch's ttl is what this is about
        await coordinator.queues.refresh()
        assert await coordinator.queue_expiry.sweep() == 1
    error = watcher.dead_letters[0].error
    assert error is not None
    said = re.fullmatch(
        r"its ttl passed in the queue of idle-agent \(100 ms of it were left when it was"
        r" dispatched there, (\d+\.\d) s after it was taken in\), which did not take it",
        error.message,
    )
    # 88 s and the coordinator's start (over a second on a loaded machine).
    assert said and 88 <= float(said[1]) < 120, error.message


async def test_the_grace_starts_again_when_the_duty_is_taken(broker):
    """With two nodes of three down and every client on the third, the coordinator's own
    connection never dropped: back with its majority, it took the duty again and ended, 2 s
    later, tasks whose agents had finished them meanwhile ("went silent")."""

    class Empty:
        def slots(self):  # type: ignore[no-untyped-def]
            return []

        def depth(self, agent_id, priority):  # type: ignore[no-untyped-def]
            return 0

    config = QueueExpiryConfig(every_s=3600, reconnect_grace_s=30)
    expiry = QueueExpiry(broker, config, Empty())
    expiry._heard_since -= 60  # connected for a minute: no grace left
    assert expiry._grace_left_s() <= 0
    duty = asyncio.create_task(expiry.run())  # the lease taken (again)
    try:
        await eventually(lambda: expiry._grace_left_s() > 29)
    finally:
        duty.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await duty


async def test_a_queued_copy_without_headers_ends_nobody_s_task(broker, start_coordinator, watcher):
    """An agent had the server copy, with no headers (a direct get's `no_hdr`), a task of its
    own making into its queue: alice's message id and box, a ttl of 1 ms. The sweep ended
    alice's task, still waiting in the intake, as `expired` in the queue of the forger (a
    security re-test). A dispatch has headers; a copy without is nobody's to end."""
    subject = broker.names.dispatch("nobody-q", "P2")
    forged = Task(v=1, message_id="alice-1", trace_id="alice-1", topic="q", caller="alice")
    honest = Task(v=1, message_id="honest-1", trace_id="honest-1", topic="q")
    async with start_coordinator(SWEEPING):
        await broker.publish(subject, encode(msgspec.structs.replace(forged, ttl_ms=1)))
        stale = msgspec.structs.replace(honest, ttl_ms=1)
        await broker.publish(subject, encode(stale), headers={"Reach-Kind": "task"})
        await watcher.dead_letter("expired", message_id="honest-1")  # the sweep went by
    assert not [d for d in watcher.dead_letters if d.message_id == "alice-1"]
