"""A handler's capacity is its own: how many of its tasks run at once, whatever their
priority; a task waiting for its handler is kept, not accepted, and the most urgent goes next."""

from __future__ import annotations

import asyncio
import functools
import threading

from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, consumer_state
from agentreach.envelopes import Ack, Heartbeat, Priority
from tests.support import until_true


def gpu_and_light(agent: Agent, release: asyncio.Event, started: list[str]) -> None:
    """``gpu`` (capacity 1) holds its task "first" until ``release``; ``light`` (5) returns."""

    @agent.handler("gpu", capacity=1)
    async def gpu(ctx: TaskContext, payload: dict) -> dict:
        started.append(payload["n"])
        if payload["n"] == "first":
            await release.wait()
        return payload

    @agent.handler("light", capacity=5)
    async def light(ctx: TaskContext, payload: dict) -> dict:
        return payload


async def test_a_handlers_capacity_limits_it_across_all_priorities(broker, coordinator):
    """gpu (capacity 1) beside light (capacity 5): six gpu tasks, two of each priority, run
    one at a time, while three light tasks run at once beside them."""
    agent = Agent("cap-1", startup_delay=0)
    running, most = {"gpu": 0}, {"gpu": 0}
    lights: list[int] = []
    all_lights = asyncio.Event()

    @agent.handler("gpu", capacity=1)
    async def gpu(ctx: TaskContext, payload: dict) -> dict:
        running["gpu"] += 1
        most["gpu"] = max(most["gpu"], running["gpu"])
        await asyncio.sleep(0.3)  # long enough for six tasks to overlap without a limit
        running["gpu"] -= 1
        return payload

    @agent.handler("light", capacity=5)
    async def light(ctx: TaskContext, payload: dict) -> dict:
        lights.append(payload["n"])
        if len(lights) == 3:
            all_lights.set()
        async with asyncio.timeout(10):
            await all_lights.wait()  # returns only once the three run together
        return payload

    priorities: list[Priority] = ["P0", "P1", "P2"] * 2
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        invoke = functools.partial(client.invoke, ack_deadline_ms=30_000)
        gpus = [invoke("gpu", {"n": n}, priority=p) for n, p in enumerate(priorities)]
        light_ones = [invoke("light", {"n": n}) for n in range(3)]
        results = await asyncio.gather(*gpus, *light_ones)
    assert results == [{"n": n} for n in range(6)] + [{"n": n} for n in range(3)]
    assert most["gpu"] == 1
    assert sorted(lights) == [0, 1, 2]


async def test_a_task_waiting_for_its_handler_is_kept_unaccepted_and_the_most_urgent_goes_next(
    broker, coordinator, watcher
):
    """While gpu's one place is taken, a P2 and then a P0 gpu task wait in hand past the
    ack wait: not delivered again, not accepted, not holding light tasks up. When the place
    frees, the P0 one runs first. The ack and the heartbeat count free places truthfully."""
    agent = Agent("cap-2", startup_delay=0, ack_wait=1.0, heartbeat_interval=0.2)
    release = asyncio.Event()
    started: list[str] = []
    gpu_and_light(agent, release, started)
    acks: dict[str, list[Ack]] = {"first": [], "later": [], "urgent": []}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:

        def invoke(n: str, priority: Priority) -> asyncio.Task[dict]:
            return asyncio.create_task(
                client.invoke(
                    "gpu",
                    {"n": n},
                    priority=priority,
                    on_ack=acks[n].append,
                    ack_deadline_ms=30_000,
                )
            )

        first = invoke("first", "P2")
        await until_true(lambda: _true(started == ["first"]))
        beat = await until_true(lambda: _beat(broker, "cap-2", in_flight=1))
        later = invoke("later", "P2")
        await until_true(lambda: _in_hand(broker, "cap-2", "P2", 2))
        urgent = invoke("urgent", "P0")
        await until_true(lambda: _in_hand(broker, "cap-2", "P0", 1))
        assert await client.invoke("light", {"n": "beside"}) == {"n": "beside"}
        await asyncio.sleep(2.0)  # past the ack wait: waiting that long is the point
        assert started == ["first"]
        assert (await _in_hand(broker, "cap-2", "P2", 2)) and (
            await _in_hand(broker, "cap-2", "P0", 1)
        )
        assert acks["later"] == acks["urgent"] == []
        release.set()
        assert [await t for t in (first, later, urgent)] == [
            {"n": "first"},
            {"n": "later"},
            {"n": "urgent"},
        ]
    assert started == ["first", "urgent", "later"]
    assert [len(a) for a in acks.values()] == [1, 1, 1]  # one delivery each: none came again
    accepted = [e.message_id for e in watcher.events if e.event == "accepted" and e.topic == "gpu"]
    assert len(accepted) == len(set(accepted)) == 3
    assert acks["first"][0].capacity is not None and acks["first"][0].capacity.free_slots == 0
    assert (beat.in_flight, beat.free_slots) == (1, 5)  # gpu's place taken, light's five free


async def test_a_stopping_agent_gives_back_a_task_waiting_for_its_handler(broker, coordinator):
    """Stopping lets the running gpu task finish; the one waiting for gpu's place (its
    priority has free slots) is not started during the drain but goes back to the queue."""
    agent = Agent("cap-3", startup_delay=0)
    release = asyncio.Event()
    started: list[str] = []
    gpu_and_light(agent, release, started)
    async with agent.running(broker=broker) as runtime, ReachClient(broker=broker) as client:
        await client.publish("gpu", {"n": "first"})
        await until_true(lambda: _true(started == ["first"]))
        await client.publish("gpu", {"n": "second"})
        await until_true(lambda: _in_hand(broker, "cap-3", "P1", 2))
        stopping = asyncio.create_task(runtime.stop())
        release.set()
        await stopping
    assert started == ["first"]
    async with agent.running(broker=broker):  # not lost: the next process of the id runs it
        await until_true(lambda: _true(started == ["first", "second"]))


async def _true(value: bool) -> bool:
    return value


async def _beat(broker: Broker, agent_id: str, *, in_flight: int) -> Heartbeat | None:
    beats = await broker.bucket(broker.names.heartbeats_bucket, Heartbeat)
    entry = await beats.get(agent_id)
    return entry.value if entry is not None and entry.value.in_flight == in_flight else None


async def _in_hand(broker: Broker, agent_id: str, priority: Priority, count: int) -> bool:
    """Whether the agent's consumer of ``priority`` has ``count`` deliveries unacknowledged."""
    names = broker.names
    stream, durable = names.dispatch_stream(priority), names.agent_consumer(agent_id, priority)
    state = await consumer_state(broker, stream, durable)
    return state is not None and state.num_ack_pending == count


async def test_an_ack_counts_no_place_kept_for_p0_as_free_to_p1(broker, coordinator):
    """capacity=2 runs one P1 task at a time (the other place is kept for P0): the ack of a
    P1 task says 0 free slots, not 1, and that of a P0 task 1 (the place left is its own)."""
    agent = Agent("kept-1", startup_delay=0)

    @agent.handler("pair", capacity=2)
    async def pair(ctx: TaskContext, payload: dict) -> dict:
        return payload

    acks: dict[Priority, list[Ack]] = {"P0": [], "P1": []}
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        for priority in ("P1", "P0"):
            await client.invoke("pair", {}, priority=priority, on_ack=acks[priority].append)
    assert [ack.capacity.free_slots for ack in acks["P1"] if ack.capacity] == [0]
    assert [ack.capacity.free_slots for ack in acks["P0"] if ack.capacity] == [1]


async def test_a_stop_cancels_what_outruns_drain_timeout_and_the_task_runs_again(
    broker, coordinator, watcher
):
    """drain_timeout (it was a fixed 10 s, past some containers' grace period): a handler
    still running then is cancelled, nothing recorded of it, and the next process of the id
    runs the task to its end."""
    agent = Agent("drained-1", startup_delay=0, drain_timeout=0.2, ack_wait=1.0)
    runs: list[str] = []
    endless = asyncio.Event()

    @agent.handler("slow")
    async def slow(ctx: TaskContext, payload: object) -> str:
        runs.append(ctx.message_id)
        if len(runs) == 1:
            await endless.wait()  # the first run outlives the drain
        return "done"

    async with ReachClient(broker=broker) as client:
        async with agent.running(broker=broker) as runtime:
            message_id, _ = await client.publish("slow", None)
            await until_true(lambda: _true(len(runs) == 1))
            with capture_logs() as logs:
                async with asyncio.timeout(5):  # not the 10 s it used to be
                    await runtime.stop()
        async with agent.running(broker=broker):
            await watcher.event("completed", message_id=message_id, timeout=20)
    assert runs == [message_id, message_id]
    assert watcher.count("failed", {message_id}) == 0
    [cut] = [e for e in logs if e["event"].startswith("handlers still running after the drain")]
    assert cut["cancelled"] == 1 and cut["log_level"] == "warning"


async def test_a_stop_waits_for_a_def_handler_it_cannot_cancel_and_reports_its_result(
    broker, coordinator, watcher
):
    """A `def` handler still running at the drain timeout was "cancelled": its thread went
    on to the end (the process waited for it), its result was thrown away, and the next
    process ran the task again, its effect twice. The stop now waits for the thread and
    reports its result; the task runs once."""
    agent = Agent("drained-2", startup_delay=0, drain_timeout=0.2, ack_wait=1.0)
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()

    @agent.handler("blocking")
    def blocking(ctx: TaskContext, payload: object) -> str:
        runs.append(ctx.message_id)
        started.set()
        release.wait(10)  # outlives the drain
        return "done once"

    async with ReachClient(broker=broker) as client, agent.running(broker=broker) as runtime:
        invoked = asyncio.create_task(client.invoke("blocking", None))
        await asyncio.to_thread(started.wait, 10)
        with capture_logs() as logs:
            stopping = asyncio.create_task(runtime.stop())
            await until_true(lambda: _true(_said(logs, "handlers in worker threads")))
            assert not stopping.done()
            release.set()
            await stopping
        assert await invoked == "done once"
    assert len(runs) == 1
    assert not _said(logs, "handlers still running after the drain timeout were cancelled")


def _said(logs: list[dict[str, object]], start: str) -> list[dict[str, object]]:
    return [e for e in logs if str(e["event"]).startswith(start)]


async def test_a_def_handler_runs_as_many_at_once_as_its_capacity(broker, coordinator):
    """Plain def handlers ran in the loop's default pool (CPUs + 4 threads): a handler of
    capacity 21 ran 6 at once on a 2-core machine, the rest waiting for a thread while
    their budgets ran out, though acknowledged and counted as running."""
    agent = Agent("threads-1", startup_delay=0)
    together = threading.Barrier(7, timeout=10)  # 7: one of the 8 places is kept for P0

    @agent.handler("meet", capacity=8)
    def meet(ctx: TaskContext, payload: object) -> int:
        return together.wait()  # each of the 7 runs until all 7 run at once

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        met = await asyncio.gather(*(client.invoke("meet", n) for n in range(7)))
    assert sorted(met) == list(range(7))
