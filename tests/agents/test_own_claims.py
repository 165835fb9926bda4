"""A claim of this very process that no delivery in hand holds (its write landed, its answer
was lost in a server restart) is taken over at once; two deliveries in hand still wait for
each other (real server)."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, TaskContext
from agentreach.agents.claims import Claims
from agentreach.broker import BrokerTimeout
from agentreach.envelopes import now_ms
from tests.support import DISPATCHED, eventually, recorded

HOLDS = "another delivery holds this message"


def gated_agent(runs: Counter[str], gate: asyncio.Event) -> Agent:
    agent = Agent("own-claims", startup_delay=0)

    @agent.handler("gated", capacity=3)  # two deliveries in, and the place P1 leaves free
    async def gated(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        await gate.wait()
        return {"n": payload["n"]}

    return agent


def a_task(message_id: str, agent: Agent) -> envelopes.Task:
    return envelopes.Task(
        v=1,
        message_id=message_id,
        trace_id=message_id,
        topic="gated",
        payload={"n": 1},
        ttl_ms=120_000,
        to_agent=agent.agent_id,
    )


async def test_its_own_lost_claim_is_taken_over_at_once_not_after_the_lease(broker, watcher):
    """This process's `running` record with a minute's lease, no delivery of the message in
    hand (as a claim write whose answer was lost leaves it): its redelivery runs at once."""
    runs, gate = Counter[str](), asyncio.Event()
    gate.set()
    agent = gated_agent(runs, gate)
    async with agent.running(broker=broker) as runtime:
        assert runtime.card is not None
        held = {"epoch": runtime.card.epoch, "lease_until_ms": now_ms() + 60_000}
        await recorded(broker, "lost-1", agent.agent_id, "running", **held)
        with capture_logs() as logs:
            subject = broker.names.dispatch(agent.agent_id, "P1")
            await broker.publish(
                subject, envelopes.encode(a_task("lost-1", agent)), headers=DISPATCHED
            )
            completed = await watcher.event("completed", message_id="lost-1", timeout=10)
    assert completed.detail["result"] == {"n": 1}
    assert runs["lost-1"] == 1
    said = [e["event"] for e in logs]
    assert HOLDS not in said
    assert "taking over this process's own claim: its write's answer was lost" in said


async def test_a_claim_whose_answer_was_lost_runs_on_its_redelivery_at_once(
    broker, watcher, monkeypatch
):
    """The chain seen after a server restart: the claim is written but its answer lost, so
    the delivery gives up (handed back); its redelivery finds the claim and runs at once, not
    after the lease (30 s here), and the handler runs once."""
    runs, gate = Counter[str](), asyncio.Event()
    gate.set()
    agent = gated_agent(runs, gate)
    claim, lost = Claims.claim, []

    async def answer_lost(self: Claims, task: envelopes.Task, *args, **kwargs):  # type: ignore[no-untyped-def]
        claimed = await claim(self, task, *args, **kwargs)
        if not lost:
            lost.append(claimed)
            raise BrokerTimeout("the server restarted before it answered")
        return claimed

    monkeypatch.setattr(Claims, "claim", answer_lost)
    async with agent.running(broker=broker):
        with capture_logs() as logs:
            subject = broker.names.dispatch(agent.agent_id, "P1")
            task = msgspec.structs.replace(a_task("lost-2", agent), ttl_ms=30_000)
            await broker.publish(subject, envelopes.encode(task), headers=DISPATCHED)
            completed = await watcher.event("completed", message_id="lost-2", timeout=10)
    assert completed.detail["result"] == {"n": 1}
    assert runs["lost-2"] == 1 and len(lost) == 1
    said = [e["event"] for e in logs]
    assert said.count("task not settled (the server away?): it comes back") == 1
    assert HOLDS not in said


async def test_two_deliveries_in_hand_at_once_still_wait_for_each_other(broker, watcher):
    """The same message delivered twice while the first runs: the second waits (said once,
    not at every poll), then answers from the first's record; the handler runs once."""
    runs, gate = Counter[str](), asyncio.Event()
    agent = gated_agent(runs, gate)
    task = a_task("twice-1", agent)
    subject = broker.names.dispatch(agent.agent_id, "P1")
    async with agent.running(broker=broker):
        with capture_logs() as logs:
            await broker.publish(subject, envelopes.encode(task), headers=DISPATCHED)
            await eventually(lambda: runs["twice-1"] == 1)
            await broker.publish(
                subject, envelopes.encode(task), headers=DISPATCHED
            )  # a duplicate delivery
            await eventually(lambda: any(e["event"] == HOLDS for e in logs))
            accepted = await watcher.event("accepted", message_id="twice-1")
            await eventually(lambda: _count(watcher, "accepted", "twice-1") == 2)
            await asyncio.sleep(1.2)  # more than two of its polls: nothing more is said
            gate.set()
            await eventually(lambda: _count(watcher, "completed", "twice-1") == 2)
    assert accepted.agent_id == agent.agent_id
    assert runs["twice-1"] == 1
    assert sum(e["event"] == HOLDS for e in logs) == 1
    durations = sorted(e.detail["duration_ms"] for e in _of(watcher, "completed", "twice-1"))
    assert durations[0] == 0  # the second answered from the record


def _of(watcher, kind: str, message_id: str) -> list[envelopes.Event]:  # type: ignore[no-untyped-def]
    return [e for e in watcher.events if e.event == kind and e.message_id == message_id]


def _count(watcher, kind: str, message_id: str) -> int:  # type: ignore[no-untyped-def]
    return len(_of(watcher, kind, message_id))


async def test_a_run_whose_lease_ran_out_unrenewed_is_not_taken_over_by_its_redelivery(
    broker, watcher, monkeypatch
):
    """The server away for longer than the lease (its renewals failed: `lease not
    extended`), and the message redelivered when it is back: the redelivery found this
    process's own claim past its lease, took it over and ran the handler a second time while
    the first run went on. It waits for the run in hand, and answers from its record."""
    runs, gate = Counter[str](), asyncio.Event()
    agent = Agent("own-claims", startup_delay=0)

    @agent.handler("gated", capacity=3, deadline_ms=300)
    async def gated(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        while not gate.is_set():
            await ctx.progress("working")  # keeps the deadline; the lease is not renewed
            await asyncio.sleep(0.1)
        return {"n": payload["n"]}

    async def unrenewed(self: Claims, task: envelopes.Task, claim, lease_ms: int) -> bool:  # type: ignore[no-untyped-def]
        return True  # as when the write fails: the old lease stands, the run goes on

    monkeypatch.setattr(Claims, "renew", unrenewed)
    task = a_task("lapsed-1", agent)
    subject = broker.names.dispatch(agent.agent_id, "P1")
    async with agent.running(broker=broker):
        await broker.publish(subject, envelopes.encode(task), headers=DISPATCHED)
        await eventually(lambda: runs["lapsed-1"] == 1)
        await asyncio.sleep(1.5)  # the scenario: the lease (300 ms + 1 s) runs out
        await broker.publish(subject, envelopes.encode(task), headers=DISPATCHED)  # the redelivery
        await eventually(lambda: _count(watcher, "accepted", "lapsed-1") == 2)
        await asyncio.sleep(0.5)  # a second run would have started by now
        assert runs["lapsed-1"] == 1
        gate.set()
        await eventually(lambda: _count(watcher, "completed", "lapsed-1") == 2)
    assert runs["lapsed-1"] == 1


async def test_a_run_taken_over_from_a_crashed_process_has_what_is_left_of_its_budget(
    broker, watcher
):
    """An earlier process of the agent began running attempt 1 and died (its record: an
    older epoch, a start 800 ms ago): the redelivery runs with the 2 s budget less those
    800 ms, not 2 s again. One begun longer ago than its budget is not run at all: it fails
    `deadline_exceeded` (retryable: the coordinator's retry decides)."""
    deadlines: dict[str, int] = {}
    agent = Agent("taken-over", startup_delay=0)

    @agent.handler("timed")
    async def timed(ctx: TaskContext, payload: dict) -> dict:
        deadlines[ctx.message_id] = ctx.deadline_ms
        return payload

    async with agent.running(broker=broker) as runtime:
        assert runtime.card is not None and runtime.card.epoch > 0
        subject = broker.names.dispatch(agent.agent_id, "P1")
        for message_id, began_ms_ago in (("half-spent-1", 800), ("spent-1", 5_000)):
            crashed = {
                "epoch": runtime.card.epoch - 1,
                "lease_until_ms": now_ms() + 60_000,
                "started_ms": now_ms() - began_ms_ago,
            }
            await recorded(broker, message_id, agent.agent_id, "running", **crashed)
            task = msgspec.structs.replace(
                a_task(message_id, agent),
                topic="timed",
                budget=envelopes.Budget(execute_ms=2_000),
            )
            await broker.publish(subject, envelopes.encode(task), headers=DISPATCHED)
        await watcher.event("completed", message_id="half-spent-1", timeout=10)
        failed = await watcher.event("failed", message_id="spent-1", timeout=10)
    # What was left (less the moments since the record was written), not a fresh 2 s.
    assert 0 < deadlines["half-spent-1"] <= 1_200, deadlines
    assert "spent-1" not in deadlines
    error = failed.detail["error"]
    assert error["type"] == "deadline_exceeded" and error["retryable"] is True
    assert "execute budget 2000 ms of attempt 1 spent" in error["message"]
