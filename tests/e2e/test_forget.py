"""`reach agents forget ID` through a real server: nothing is left of the agent, in KV, in
the streams' consumers or in a running coordinator; the tasks still queued for it go on
(to another agent, or to a dead letter saying why); the id registers again as new."""

from __future__ import annotations

import asyncio

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import consumer_state
from agentreach.broker.streams import subject_counts
from agentreach.dashboard import top
from agentreach.dashboard.history import History
from agentreach.dashboard.views import Board
from agentreach.envelopes import AgentCard, BreakerRecord, Heartbeat, Intent, Liveness, now_ms
from tests.cli.conftest import reach_argv, run
from tests.conftest import FAST
from tests.support import DISPATCHED, eventually, until_true

GONE = "retiree"


def _agent(agent_id: str, *topics: str) -> Agent:
    agent = Agent(agent_id, startup_delay=0)
    for topic in topics:
        agent.handler(topic, capacity=2)(_by(agent_id))
    return agent


def _by(agent_id: str):  # type: ignore[no-untyped-def]
    async def handle(ctx: TaskContext, payload: dict) -> dict:
        return {"by": agent_id}

    return handle


async def reach(broker, *args: str):  # type: ignore[no-untyped-def]
    return await run(*reach_argv(broker, *args))


async def _queue(broker, message_id: str, topic: str) -> None:  # type: ignore[no-untyped-def]
    """A task left in the gone agent's P1 queue, as one dispatched just as it stopped."""
    task = envelopes.Task(
        v=1, message_id=message_id, trace_id=message_id, topic=topic, ttl_ms=30_000, to_agent=GONE
    )
    await broker.publish(
        broker.names.dispatch(GONE, "P1"), envelopes.encode(task), headers=DISPATCHED
    )


async def _trip(broker) -> None:  # type: ignore[no-untyped-def]
    """An open breaker of the gone agent's intent, and its isolation."""
    bucket = await broker.bucket(broker.names.breakers_bucket, BreakerRecord)
    until = now_ms() + 60_000
    for intent in ("chores", ""):
        record = BreakerRecord(
            agent_id=GONE, intent=intent, state="open", since_ms=now_ms(), open_until_ms=until
        )
        await bucket.put(record.key, record)


async def _left_in_kv(broker) -> dict[str, object]:  # type: ignore[no-untyped-def]
    names, found = broker.names, {}
    for bucket, kind in (
        (names.agents_bucket, AgentCard),
        (names.heartbeats_bucket, Heartbeat),
        (names.liveness_bucket, Liveness),
    ):
        if (entry := await (await broker.bucket(bucket, kind)).get(GONE)) is not None:
            found[bucket] = entry.value
    breakers = await (await broker.bucket(names.breakers_bucket, BreakerRecord)).snapshot()
    found |= {key: e.value for key, e in breakers.items() if e.value.agent_id == GONE}
    for priority, stream in names.dispatch_streams.items():
        durable = names.agent_consumer(GONE, priority)
        if await consumer_state(broker, stream, durable) is not None:
            found[durable] = stream
    return found


async def _depth(broker) -> int:  # type: ignore[no-untyped-def]
    names = broker.names
    counts = await subject_counts(broker, names.dispatch_stream("P1"), names.dispatch(GONE, "P1"))
    return sum(counts.values())


async def test_forget_leaves_nothing_moves_its_queue_and_the_id_registers_again(
    broker, coordinator, watcher
):
    """A stopped agent with breakers, consumers and two tasks still queued is forgotten:
    KV, consumers and the running coordinator's views hold nothing of it; the task another
    agent serves is completed there, the one nobody serves is dead-lettered no_route, both
    saying why they moved; a new process of the id is ONLINE, served, and not tripped."""
    async with _agent(GONE, "chores", "own_chores").running(broker=broker):
        await watcher.state(GONE, "ONLINE")
    await watcher.state(GONE, "OFFLINE", reason="stopped")
    await _trip(broker)
    await eventually(lambda: any(r.agent_id == GONE for r in coordinator.breakers.records.values()))
    await _queue(broker, "for-heir", "chores")
    await _queue(broker, "for-nobody", "unserved_chores")
    async with _agent("heir", "chores").running(broker=broker):
        forgotten = await reach(broker, "agents", "forget", GONE)
        completed = await watcher.event("completed", message_id="for-heir")
        letter = await watcher.dead_letter("no_route", message_id="for-nobody")
    moved = [e for e in watcher.events if e.event == "retry_scheduled"]
    await eventually(lambda: GONE not in coordinator.liveness.agents)
    views = (
        GONE in coordinator.directory.cards,
        any(r.agent_id == GONE for r in coordinator.breakers.records.values()),
        await coordinator.liveness.clear(GONE),
    )
    left, depth = await _left_in_kv(broker), await _depth(broker)
    last = watcher.states(GONE)[-1]
    async with _agent(GONE, "chores", "own_chores").running(broker=broker):
        back = await watcher.state(GONE, "ONLINE", after=last)
        await broker.publish(broker.names.task("own_chores"), b"{}", headers={"Nats-Msg-Id": "b1"})
        again = await watcher.event("completed", message_id="b1")
        admitted = coordinator.breakers.admission(GONE, "chores")[0].verdict
    assert forgotten.returncode == 0, forgotten.stderr
    assert "2 breaker record(s) and 3 dispatch consumer(s) are deleted" in forgotten.stdout
    assert "2 task(s) queued for it" in forgotten.stdout
    assert completed.agent_id == "heir"
    assert letter.reason == "no_route" and letter.topic == "unserved_chores"
    assert {e.message_id for e in moved} == {"for-heir", "for-nobody"}
    assert all(f"{GONE} is no longer registered" in str(e.detail["error"]) for e in moved)
    assert views == (False, False, "unknown agent")
    assert left == {} and depth == 0
    assert back.detail["reason"] == "heartbeat" and again.agent_id == GONE and admitted == "ok"


async def test_tasks_of_an_agent_forgotten_while_no_coordinator_ran_move_when_one_starts(
    broker, start_coordinator, watcher
):
    """With no coordinator, forget warns that the queued task waits; the dashboard and
    `reach top` stop showing the agent at once; a coordinator started afterwards
    dead-letters the task (nobody serves it) instead of leaving it in the queue."""
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    card = AgentCard(agent_id=GONE, intents={"lonely": Intent(version="1")}, status="stopped")
    await cards.put(GONE, card)
    await _queue(broker, "stranded", "lonely")
    async with Board(broker, History(step_s=1, window_s=60, period_s=30)) as board:
        before = [a["agent_id"] for a in board.snapshot()["agents"]]
        forgotten = await reach(broker, "agents", "forget", GONE)
        await eventually(lambda: not board.snapshot()["agents"])
        shown = top.render(board.snapshot())
    waiting = await _depth(broker)
    async with start_coordinator(FAST):
        letter = await watcher.dead_letter("no_route", message_id="stranded")
        await until_true(lambda: _empty(broker))
    assert before == [GONE] and GONE not in shown
    assert forgotten.returncode == 0, forgotten.stderr
    assert "no coordinator is running" in forgotten.stderr
    assert "its queued tasks move when one starts" in forgotten.stderr
    assert waiting == 1 and letter.topic == "lonely"


async def _empty(broker) -> bool:  # type: ignore[no-untyped-def]
    return await _depth(broker) == 0


async def test_an_agent_judged_suspect_is_not_forgotten(broker):
    """A SUSPECT agent is expected back: forget refuses it, and deletes nothing."""
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    await cards.put(GONE, AgentCard(agent_id=GONE, intents={"lonely": Intent(version="1")}))
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    suspect = Liveness(agent_id=GONE, state="SUSPECT", since_ms=now_ms(), epoch=1)
    await verdicts.put(GONE, suspect)
    refused = await reach(broker, "agents", "forget", GONE)
    assert refused.returncode == 1
    assert f"{GONE} is SUSPECT: only an OFFLINE or STOPPED agent can be forgotten" in (
        refused.stderr
    )
    assert set(await _left_in_kv(broker)) == {
        broker.names.agents_bucket,
        broker.names.liveness_bucket,
    }


async def test_a_live_agent_whose_card_is_deleted_is_not_forgotten(broker, coordinator, watcher):
    """Only `reach agents forget` forgets, and it refuses a live agent; a card deleted
    otherwise (by the agent itself, say: its permissions allow it) while the agent runs a
    task leaves it judged, its task where it is, and the task runs once, there."""
    gate = asyncio.Event()
    agent = Agent(GONE, startup_delay=0)

    @agent.handler("slow_chores")
    async def hold(ctx: TaskContext, payload: dict) -> dict:
        await gate.wait()
        return {"by": GONE}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        await watcher.state(GONE, "ONLINE")
        message_id, _ = await client.publish("slow_chores", {})
        await watcher.event("accepted", message_id=message_id)
        await (await broker.bucket(broker.names.agents_bucket, AgentCard)).delete(GONE)
        await eventually(lambda: GONE not in coordinator.directory.cards)
        await coordinator.liveness.moves.sweep()  # what the next sweep would move
        judged = GONE in coordinator.liveness.agents
        gate.set()
        done = await watcher.event("completed", message_id=message_id)
    assert judged
    assert done.agent_id == GONE
    assert watcher.count("retry_scheduled") == 0 and watcher.count("accepted") == 1
