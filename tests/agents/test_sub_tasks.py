"""Sub-tasks from a handler (ctx.invoke, ctx.publish) on a real server: in the parent's
trace, at its priority, within its time, and once each however often the parent runs."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec
import pytest

from agentreach.agents import Agent, ReachClient, TaskContext, TaskFailed, UnexpectedResult
from agentreach.envelopes import Task, sub_task_id
from tests.support import Watcher, eventually


class Finding(msgspec.Struct, frozen=True):
    source: str
    facts: int


def desk(runs: Counter[str], seen: list[TaskContext]) -> tuple[Agent, Agent]:
    """A planner that asks two researchers and fails its first attempt after asking them
    (a crash after the sub-tasks ran), and the researchers, counting their runs."""
    planner = Agent("sub-planner", startup_delay=0)

    @planner.handler("plan", max_attempts=2)
    async def plan(ctx: TaskContext, payload: dict) -> dict:
        runs["plan"] += 1
        found = await asyncio.gather(
            ctx.invoke("research", {"source": "web"}, result_type=Finding),
            ctx.invoke("research", {"source": "papers"}, result_type=Finding),
        )
        if ctx.attempt == 1:
            raise RuntimeError("crashed after asking")
        return {"facts": sum(f.facts for f in found), "types": [type(f).__name__ for f in found]}

    researcher = Agent("sub-researcher", startup_delay=0)

    @researcher.handler("research", capacity=4)
    async def research(ctx: TaskContext, payload: dict) -> dict:
        runs[payload["source"]] += 1
        seen.append(ctx)
        return {"source": payload["source"], "facts": len(payload["source"])}

    return planner, researcher


async def test_a_parent_run_again_attaches_to_its_sub_tasks_instead_of_running_them_twice(
    broker, coordinator
):
    runs: Counter[str] = Counter()
    seen: list[TaskContext] = []
    planner, researcher = desk(runs, seen)
    async with (
        planner.running(broker=broker),
        researcher.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        result = await client.invoke("plan", {}, priority="P0", message_id="plan-1")
    assert result == {"facts": 3 + 6, "types": ["Finding", "Finding"]}
    assert runs == {"plan": 2, "web": 1, "papers": 1}
    assert {ctx.trace_id for ctx in seen} == {"plan-1"}
    assert {ctx.envelope.priority for ctx in seen} == {"P0"}
    assert {ctx.envelope.caller for ctx in seen} == {"sub-planner"}
    assert all(ctx.envelope.budget.execute_ms <= 30_000 for ctx in seen)


async def test_sub_task_ids_are_derived_from_the_parent_and_the_order_or_a_key(broker):
    parent = Task(v=1, message_id="p-1", trace_id="t", topic="plan", created_at=1_000)
    first, second = sub_task_id("p-1", 1_000, "a", "1"), sub_task_id("p-1", 1_000, "a", "2")
    others = {sub_task_id("p-2", 1_000, "a", "1"), sub_task_id("p-1", 1_000, "b", "1")}
    assert len({first, second, *others}) == 4  # another parent's, another agent's
    assert sub_task_id("p-1", 1_000, "a", "1") == first  # the same in every run
    from agentreach.agents.deadline import Deadline

    async def nothing(task: Task) -> None:
        return None

    ctx = TaskContext(
        parent,
        agent_id="a",
        deadline=Deadline(budget_ms=30_000, window_ms=None),
        report_progress=lambda note: nothing(parent),
        submit=nothing,
        loop=asyncio.get_running_loop(),
    )
    made = [ctx.child_task("x", {}), ctx.child_task("x", {}), ctx.child_task("x", {}, key="k")]
    assert [t.message_id for t in made] == [first, second, sub_task_id("p-1", 1_000, "a", "k")]
    with pytest.raises(RuntimeError, match="cannot invoke"):
        await ctx.invoke("x", {})


async def test_a_sub_task_s_failure_and_an_unexpected_result_reach_the_parent(broker, coordinator):
    """A sub-task that fails raises TaskFailed in the parent (which decides); a result that
    does not fit `result_type` raises UnexpectedResult naming where."""
    parent = Agent("sub-parent", startup_delay=0)
    said: list[str] = []

    @parent.handler("ask", max_attempts=1)
    async def ask(ctx: TaskContext, payload: dict) -> str:
        try:
            await ctx.invoke("fails", {})
        except TaskFailed as exc:
            said.append(f"failed: {exc.error.type}")
        try:
            await ctx.invoke("answers", {}, result_type=Finding)
        except UnexpectedResult as exc:
            said.append(f"unexpected: {exc.result}")
        return "done"

    child = Agent("sub-child", startup_delay=0)

    @child.handler("fails", max_attempts=1)
    async def fails(ctx: TaskContext, payload: dict) -> None:
        raise ValueError("no")

    @child.handler("answers")
    async def answers(ctx: TaskContext, payload: dict) -> list[int]:
        return [1, 2]

    async with (
        parent.running(broker=broker),
        child.running(broker=broker),
        ReachClient(broker=broker) as client,
        Watcher(broker) as watcher,
    ):
        assert await client.invoke("ask", {}) == "done"
        await eventually(lambda: watcher.count("completed") >= 2)
    assert said == ["failed: ValueError", "unexpected: [1, 2]"]


def test_sub_task_ids_match_the_typescript_sdk_s():
    """Both SDKs derive the same id (a process of either language may run an agent id)."""
    parent = "01a23cc1-9606-73c5-bdb2-bbc1070d3bb4"
    assert (
        sub_task_id(parent, 1796315348000, "planner-1", "1")
        == "01a23cbc-fc20-7a84-bb7e-2ebf0316b02c"
    )
    assert sub_task_id("p-1", 0, "a", "web") == "00000000-0000-71ac-876a-5cd64ca64993"


async def test_a_def_handler_invokes_from_its_thread(broker, coordinator):
    parent = Agent("sub-sync", startup_delay=0)

    @parent.handler("sync-ask")
    def ask(ctx: TaskContext, payload: dict) -> dict:
        return {"got": ctx.invoke_sync("sync-answer", {"n": 2})}

    child = Agent("sub-sync-child", startup_delay=0)

    @child.handler("sync-answer")
    async def answer(ctx: TaskContext, payload: dict) -> int:
        return payload["n"] * 10

    async with (
        parent.running(broker=broker),
        child.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        assert await client.invoke("sync-ask", {}) == {"got": 20}


async def test_a_sync_call_from_an_async_handler_fails_the_task_and_not_the_agent(
    broker, coordinator
):
    """`ctx.invoke_sync()` in an `async def` handler waited, on the agent's event loop, for
    what that loop had to run: every topic of the agent stopped for good, SIGTERM was
    ignored, and the caller heard DeadlineExceeded. It fails the task at once, not retried,
    saying what to await instead; the agent serves on."""
    agent = Agent("sub-misused", startup_delay=0)

    @agent.handler("misused")
    async def misused(ctx: TaskContext, payload: dict) -> object:
        if payload.get("progress"):
            ctx.progress_sync("half way")
        return ctx.invoke_sync("sync-answer", {"n": 2})

    @agent.handler("fine")
    async def fine(ctx: TaskContext, payload: dict) -> str:
        return "still serving"

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        for payload, call in (({}, "invoke_sync"), ({"progress": True}, "progress_sync")):
            with pytest.raises(TaskFailed) as failed:
                await client.invoke("misused", payload, ack_deadline_ms=5_000)
            error = failed.value.error
            assert (error.type, error.retryable, failed.value.attempts) == (
                "SyncCallOnLoop",
                False,
                1,
            )
            assert f"ctx.{call}() called from an async handler" in error.message
        assert await client.invoke("fine", {}) == "still serving"


async def test_a_failed_sub_task_fails_its_parent_as_sub_task_failed_and_isolates_no_agent(
    broker, start_coordinator, watcher
):
    """The parent's failure is its dependency's: `sub_task_failed` (not retried: a run again
    would hear the same end), not counted against the parent (five failing dependencies
    isolated a healthy order agent for every caller). A sub-task queued behind a busy agent
    is waited for within the parent's time, not failed after 2 s."""
    from agentreach.coordinator import BreakerConfig
    from tests.e2e.routing_support import fast

    parent = Agent("sub-order", startup_delay=0)

    @parent.handler("order", max_attempts=1)
    async def order(ctx: TaskContext, payload: dict) -> dict:
        return await ctx.invoke(payload["to"], {}, ack_deadline_ms=payload.get("ack_ms"))

    payments = Agent("sub-pay", startup_delay=0)  # fails for real: it may be isolated

    @payments.handler("pay", max_attempts=1)
    async def pay(ctx: TaskContext, payload: dict) -> dict:
        raise RuntimeError("card declined")

    child = Agent("sub-stock", startup_delay=0)

    @child.handler("stock", capacity=1)
    async def stock(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(1.5)  # the work: a second one queues behind it past 2 s
        return {"reserved": True}

    breakers = BreakerConfig(min_calls=1000, open_s=30, isolation_failures=3)
    async with (
        start_coordinator(fast(breakers=breakers)) as coordinator,
        parent.running(broker=broker),
        payments.running(broker=broker),
        child.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        serving = {"sub-order", "sub-pay", "sub-stock"}
        await eventually(lambda: serving <= set(coordinator.directory.cards))
        errors = []
        for _ in range(5):
            with pytest.raises(TaskFailed) as failed:
                await client.invoke("order", {"to": "pay"})
            errors.append(failed.value.error)
        queued = [
            client.invoke("order", {"to": "stock"}, execute_deadline_ms=10_000) for _ in range(2)
        ]
        assert await asyncio.gather(*queued) == [{"reserved": True}] * 2
        # Not accepted in time behind a busy agent: retryable (the sub-task may still run),
        # and still not the parent's failure.
        busy = asyncio.create_task(client.invoke("order", {"to": "stock"}))

        def stock_busy() -> bool | None:
            taken = [
                e for e in watcher.events if (e.event, e.agent_id) == ("accepted", "sub-stock")
            ]
            return len(taken) >= 3 or None

        await watcher.until(stock_busy, "stock busy with the third")
        for _ in range(4):
            with pytest.raises(TaskFailed) as late:
                await client.invoke("order", {"to": "stock", "ack_ms": 50})
            errors.append(late.value.error)
        assert await busy == {"reserved": True}
    assert {(e.type, e.retryable) for e in errors} == {
        ("sub_task_failed", False),
        ("sub_task_failed", True),
    }
    assert "NotAcknowledged" in errors[-1].message
    assert "TaskFailed: RuntimeError: card declined" in errors[0].message
    assert "Rejected: circuit_open" in errors[4].message  # the payments agent, isolated
    isolated = [e.agent_id for e in watcher.events if e.event == "agent_isolated"]
    assert "sub-order" not in isolated and "sub-order" not in coordinator.breakers.isolated
