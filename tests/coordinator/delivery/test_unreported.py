"""Attempts an agent acknowledged and never reported, on a real server: the coordinator
ends them as `expired` once, with a letter and an `unreported` alert naming the agent, and
never a task that completes or still runs within its budget."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.agents.execution import Executor
from agentreach.broker import Delivery
from agentreach.broker.names import COORDINATOR
from agentreach.broker.streams import delete_message, next_message
from agentreach.coordinator import UnreportedConfig
from agentreach.coordinator.delivery.unreported import Unreported, _ran_or_moved_on
from agentreach.envelopes import (
    REASSIGNED,
    Budget,
    ErrorInfo,
    Event,
    Execution,
    Task,
    execution_key,
    now_ms,
)
from tests.conftest import FAST
from tests.support import Watcher, events_settled, eventually, letter_of

# Open attempts looked at every 0.1 s, with 0.2 s of grace past the ttl and the budget.
FOLLOWING = msgspec.structs.replace(FAST, unreported=UnreportedConfig(every_s=0.1, grace_s=0.2))
SHORT = Budget(execute_ms=400)


async def _ack_on_receipt(self: Executor, delivery: Delivery) -> None:
    """An agent that acknowledges a dispatch as it comes, and does nothing else."""
    await delivery.ack()


async def _drop_the_outcome(self: Executor, job: object, outcome: object) -> None:
    """An agent that ran the task (accepted, claimed) and lost its outcome: the delivery is
    acknowledged all the same."""


def _agent(agent_id: str, *, release: asyncio.Event | None = None) -> Agent:
    agent = Agent(agent_id, startup_delay=0, heartbeat_interval=0.5)

    @agent.handler("work")
    async def work(ctx: TaskContext, payload: object) -> object:
        if release is not None:
            await release.wait()
        return payload

    return agent


def _unreported_alerts(watcher: Watcher) -> list[Event]:
    alerts = [e for e in watcher.events if e.event == "alert"]
    return [e for e in alerts if e.detail.get("problem") == "unreported"]


async def test_a_dispatch_acknowledged_on_receipt_and_never_reported_ends_expired_once(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """The trace stopped at `routed`: past the dispatch's ttl and budget the task is
    dead-lettered as `expired` (no task in the letter: its body left with the dispatch), an
    alert names the agent, and the agent's record holds the fence."""
    monkeypatch.setattr(Executor, "settle", _ack_on_receipt)
    async with (
        start_coordinator(FOLLOWING) as coordinator,
        _agent("liar-1").running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        message_id, _ = await client.publish("work", {"n": 1}, ttl_ms=300, budget=SHORT)
        letter = await watcher.dead_letter("expired", message_id=message_id)
        alert = await watcher.until(lambda: next(iter(_unreported_alerts(watcher)), None), "alert")
        await eventually(lambda: coordinator.unreported.ended == 1)
        assert await coordinator.unreported.sweep() == 0  # nothing left to end
        executions = await broker.bucket(broker.names.executions_bucket, Execution)
        caller = letter.trace[0].caller
        fence = await executions.get(execution_key(caller, message_id, "liar-1"))
    assert letter.envelope is None and letter.reason == "expired"
    assert letter.error is not None and letter.error.type == "expired"
    assert letter.error.message.startswith("liar-1 acknowledged attempt 1 and never reported")
    assert [e.event for e in letter.trace] == ["routed"]
    assert alert.agent_id == "liar-1" and alert.detail["message_id"] == message_id
    assert fence is not None and fence.value.state == "failed"
    assert watcher.count("dead_lettered", {message_id}) == 1
    ended = next(e for e in watcher.events if e.event == "dead_lettered")
    assert ended.detail["ran"] is True  # a caller is told TaskFailed: it may have run


async def test_another_caller_s_letter_under_the_id_ends_nothing_of_this_attempt(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """mallory sent a task under alice's id and trace to a topic nobody serves: its letter
    was taken for the end of alice's attempt, which her agent dropped, and her trace stopped
    at `routed` for good (a security re-test)."""
    monkeypatch.setattr(Executor, "settle", _ack_on_receipt)
    own = Task(v=1, message_id="shared-9", trace_id="shared-9", topic="nobody", caller="mallory")
    await letter_of(broker, own, reason="no_route")
    async with (
        start_coordinator(FOLLOWING),
        _agent("liar-2").running(broker=broker),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        await alice.publish("work", {"n": 9}, message_id="shared-9", ttl_ms=300, budget=SHORT)
        letter = await watcher.dead_letter("expired", message_id="shared-9")
    assert letter.error is not None and "liar-2 acknowledged attempt 1" in letter.error.message


async def test_an_accepted_attempt_ends_by_its_execute_budget_not_by_its_long_ttl(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """An agent that accepted, claimed and ran the task, and lost its outcome: the attempt
    ends once the budget counted from `accepted` (and the claim's lease) is over, long before
    the task's 60 s ttl; its caller is told `expired`."""
    monkeypatch.setattr(Executor, "_conclude", _drop_the_outcome)
    async with (
        start_coordinator(FOLLOWING),
        _agent("dropper-1").running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        loop = asyncio.get_running_loop()
        started = loop.time()
        message_id, _ = await client.publish("work", {"n": 2}, ttl_ms=60_000, budget=SHORT)
        letter = await watcher.dead_letter("expired", message_id=message_id)
        took_s = loop.time() - started
    assert [e.event for e in letter.trace][:2] == ["routed", "accepted"]
    assert letter.error is not None and "dropper-1 acknowledged attempt 1" in letter.error.message
    assert took_s < 30, took_s  # the budget, the lease's grace and a pass: not the ttl


async def test_tasks_that_complete_or_still_run_within_their_budget_are_not_ended(
    broker, start_coordinator, watcher
):
    """Conforming agents: a completed task is never looked at again, and one whose handler
    still holds its claim past the follower's own reckoning (a long budget) is left to run."""
    release = asyncio.Event()
    async with (
        start_coordinator(FOLLOWING) as coordinator,
        _agent("honest-1", release=release).running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        running_id, _ = await client.publish("work", {"n": 3}, budget=Budget(execute_ms=20_000))
        await watcher.event("accepted", message_id=running_id)
        # The follower reads the same events through a consumer of its own: it may lag.
        await eventually(lambda: coordinator.unreported.open_count == 1)
        assert await coordinator.unreported.sweep() == 0
        release.set()
        await watcher.event("completed", message_id=running_id)
        result = await client.invoke("work", {"n": 4}, execute_deadline_ms=400)
        assert result == {"n": 4}
        await eventually(lambda: coordinator.unreported.open_count == 0)
        assert await coordinator.unreported.sweep() == 0
    assert watcher.dead_letters == []
    assert _unreported_alerts(watcher) == []


async def test_a_replica_that_takes_the_duty_over_finds_an_attempt_routed_before_it(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """The coordinator that routed the attempt (with a minute's grace) stops before its time
    is up; the next one reads the events from the oldest open attempt the first stored
    (further back than its own lookback), and ends it."""
    monkeypatch.setattr(Executor, "settle", _ack_on_receipt)
    patient = msgspec.structs.replace(FOLLOWING, unreported=UnreportedConfig(grace_s=60))
    quick = msgspec.structs.replace(
        FOLLOWING, unreported=UnreportedConfig(every_s=0.1, grace_s=0.2, lookback_s=0.5)
    )
    async with _agent("liar-2").running(broker=broker), ReachClient(broker=broker) as client:
        async with start_coordinator(patient) as first:
            message_id, _ = await client.publish("work", {"n": 5}, ttl_ms=300, budget=SHORT)
            await eventually(lambda: first.unreported.open_count == 1)
            await first.unreported.sweep()  # stores where the next holder starts
        await asyncio.sleep(0.6)  # past the lookback: only the stored mark finds the attempt
        assert watcher.dead_letters == []
        async with start_coordinator(quick) as second:
            letter = await watcher.dead_letter("expired", message_id=message_id)
            await eventually(lambda: second.unreported.ended == 1)
    assert letter.error is not None and "liar-2 acknowledged" in letter.error.message


async def _hold(self: Executor, delivery: Delivery) -> None:
    """An agent that took the dispatch and stalled: nothing acknowledged, nothing claimed."""


async def test_a_dispatch_still_in_its_agents_queue_is_left_to_the_queue(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """An attempt past its time whose dispatch its agent never acknowledged (a paused
    agent's) is not this pass's to end: its move, once the agent is judged gone, or the
    queue sweep ends it. Ended here as well, it was moved on, ran again and ended twice.
    Once the dispatch has left the queue unreported, the pass ends it."""
    monkeypatch.setattr(Executor, "settle", _hold)
    async with (
        start_coordinator(FOLLOWING) as coordinator,
        _agent("stalled-1").running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        message_id, _ = await client.publish("work", {"n": 6}, ttl_ms=300, budget=SHORT)
        await eventually(lambda: coordinator.unreported.open_count == 1)
        [found] = coordinator.unreported._open.values()
        found.due_ms = 0
        assert await coordinator.unreported.sweep() == 0
        assert found.due_ms > now_ms() and watcher.dead_letters == []
        stream = broker.names.dispatch_streams["P1"]
        queued = await next_message(broker, stream, broker.names.dispatch("stalled-1", "P1"))
        assert queued is not None
        await delete_message(broker, stream, queued.stream_seq)  # acknowledged, unreported
        found.due_ms = 0
        await watcher.dead_letter("expired", message_id=message_id)
    assert len(watcher.dead_letters) == 1


async def test_a_failure_reported_after_the_attempt_was_ended_unreported_starts_no_retry(
    broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
):
    """An agent that acknowledges on receipt paused mid-run: its attempt was ended as
    `expired` (unreported). Its failure, reported when it woke, started a retry: the task
    ran again after its dead letter, and ended twice. The report is left alone."""
    settle, conclude = Executor.settle, Executor._conclude
    woke = asyncio.Event()
    runs: list[int] = []

    async def ack_first(self: Executor, delivery: Delivery) -> None:
        await delivery.ack()
        await settle(self, delivery)

    async def after_a_pause(self: Executor, job: object, outcome: object) -> None:
        await woke.wait()
        await conclude(self, job, outcome)  # type: ignore[arg-type]

    monkeypatch.setattr(Executor, "settle", ack_first)
    monkeypatch.setattr(Executor, "_conclude", after_a_pause)
    agent = Agent("paused-1", startup_delay=0, heartbeat_interval=0.5)

    @agent.handler("flaky")
    async def flaky(ctx: TaskContext, payload: object) -> object:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("the first try fails")
        return payload

    async with (
        start_coordinator(FOLLOWING),
        agent.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        message_id, _ = await client.publish("flaky", {"n": 7}, ttl_ms=300, budget=SHORT)
        await watcher.dead_letter("expired", message_id=message_id)
        woke.set()
        await watcher.event("failed", message_id=message_id)
        await events_settled(broker, broker.names.coordinator_outcomes)
    assert runs == [1]
    assert watcher.count("retry_scheduled", {message_id}) == 0
    assert len(watcher.dead_letters) == 1


class _Stored:
    """An event as the follower is handed it: its subject, its bytes, its store time."""

    def __init__(self, broker, event: Event, sender: str, stored_ms: int, headers=None) -> None:  # type: ignore[no-untyped-def]
        self.subject = broker.names.event(
            event.event, event.topic, event.trace_id, event.message_id, sender
        )
        self.data = msgspec.json.encode(event)
        self.timestamp_ms = stored_ms
        self.headers = {"Nats-Msg-Id": "as-sent"} if headers is None else headers


def _event(kind: str, attempt: int = 1, agent_id: str = "a-1", **detail: object) -> Event:
    return Event(
        v=1, event=kind, message_id="m-1", trace_id="t-1", topic="work", attempt=attempt,
        agent_id=agent_id, caller="c-1", detail=detail,
    )  # fmt: skip


async def test_the_follower_believes_only_the_coordinator_s_routing_and_the_agent_s_own_reports(
    broker,
):
    """The fold alone: `accepted` narrows the time to the budget from then; another party's
    `completed` (a forger on an open server) closes nothing; an older attempt's `routed` does
    not replace a newer one; the agent's own report, or a dead letter, closes the attempt."""
    unreported = Unreported(broker, UnreportedConfig(grace_s=1.0))
    fold = unreported.fold

    def opened() -> int:
        return unreported._open[("c-1", "m-1")].due_ms

    fold(_Stored(broker, _event("routed", 2, ttl_ms=5_000, execute_ms=3_000), COORDINATOR, 0))
    assert opened() == 5_000 + 3_000 + 1_000
    fold(_Stored(broker, _event("routed", 1, agent_id="old-1"), COORDINATOR, 10))
    assert unreported._open[("c-1", "m-1")].agent_id == "a-1"  # the newer attempt stays
    fold(_Stored(broker, _event("accepted", 2), "a-1", 2_000))
    assert opened() == 2_000 + 3_000 + 1_000
    fold(_Stored(broker, _event("completed", 2, agent_id="a-1"), "forger-1", 2_500))
    assert unreported.open_count == 1
    fold(_Stored(broker, _event("failed", 1), "a-1", 2_600))  # an earlier attempt's report
    assert unreported.open_count == 1
    fold(_Stored(broker, _event("completed", 2), "a-1", 2_700))
    assert unreported.open_count == 0
    fold(_Stored(broker, _event("routed", 3), COORDINATOR, 3_000))
    fold(_Stored(broker, _event("dead_lettered", 1, agent_id=None), COORDINATOR, 3_100))
    assert unreported.open_count == 0


async def test_a_routed_event_stored_as_a_server_s_answer_opens_no_attempt(broker) -> None:
    """An agent had the server store, as the coordinator's `routed`, a direct get's answer
    of content it wrote (a security re-test): the pass later dead-lettered the message as
    `expired` and sent the error to the `reply_to` the forgery named."""
    unreported = Unreported(broker, UnreportedConfig(grace_s=1.0))
    answer = {"Nats-Stream": "KV_reach_executions", "Nats-Subject": "$KV.reach_executions.x"}
    unreported.fold(_Stored(broker, _event("routed", 1), COORDINATOR, 0, headers=answer))
    assert unreported.open_count == 0
    # Asked for no headers (no_hdr), the copy has none: the coordinator's own always have one.
    unreported.fold(_Stored(broker, _event("routed", 1), COORDINATOR, 0, headers={}))
    assert unreported.open_count == 0
    unreported.fold(_Stored(broker, _event("routed", 1), COORDINATOR, 0))
    assert unreported.open_count == 1


def test_an_attempt_taken_from_its_dead_agent_is_not_ended_as_unreported() -> None:
    """The only agent of a topic was killed holding an accepted attempt: judged OFFLINE, its
    attempt was fenced and moved to intake, where it waited for an agent within its 900 s
    ttl. Past the execute budget and the grace the duty dead-lettered it `expired`, alerting
    that the agent never reported, and the held task then ran too (a walkthrough). The
    reassignment fence (its claim's lease kept, `finished_at_ms` 0) says it moved on."""
    task = Task(v=1, message_id="m-1", trace_id="m-1", topic="work", caller="alice")
    fence = Execution(
        message_id="m-1", state="failed", agent_id="victim-1", epoch=1, attempt=1,
        lease_until_ms=now_ms() - 1, caller="alice",
        error=ErrorInfo(type=REASSIGNED, message="its agent went OFFLINE", retryable=True),
    )  # fmt: skip
    assert _ran_or_moved_on([fence], task, "victim-1")
    running = msgspec.structs.replace(fence, state="running", error=None)
    assert not _ran_or_moved_on([running], task, "victim-1")  # still to judge
