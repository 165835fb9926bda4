"""`reach agents show ID`: one agent in full, with the tasks it runs now and its queues."""

from __future__ import annotations

import asyncio
import json

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker.direct import subject_counts
from agentreach.cli.agent_detail import Detail, render
from agentreach.cli.agent_rows import Row
from tests.cli.conftest import reach_argv, run
from tests.support import recorded, until_true, wait_for_card


async def reach(broker, *args: str):  # type: ignore[no-untyped-def]
    return await run(*reach_argv(broker, *args))


async def test_show_lists_the_task_an_agent_runs_now_and_its_queues(broker, coordinator, watcher):
    """A handler holds its task: the agent's record of that run is shown (message id,
    attempt, caller, lease), with its card, heartbeat and the queues (Celery's `inspect
    active`). Once the task completes, nothing runs."""
    release = asyncio.Event()
    agent = Agent("show-worker-1", tags={"role": "worker"}, startup_delay=0)

    @agent.handler("hold", capacity=2, deadline_ms=30_000)
    async def hold(ctx: TaskContext, payload: object) -> object:
        await release.wait()
        return {"held": True}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        await wait_for_card(broker, "show-worker-1", status="running")
        message_id, _ = await client.publish("hold", {})
        await watcher.event("accepted", message_id=message_id)
        shown = await reach(broker, "agents", "show", "show-worker-1")
        as_json = await reach(broker, "agents", "show", "show-worker-1", "--json")
        release.set()
        await watcher.event("completed", message_id=message_id)
        after = await reach(broker, "agents", "show", "show-worker-1", "--json")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("agent     show-worker-1 (epoch ")
    intent = "intent    hold@1: capacity 2, deadline 30000 ms, max_attempts the coordinator's"
    assert intent + " setting" in lines
    assert "tags      role=worker" in lines
    assert "queued    P0 0 · P1 1 · P2 0 (the running ones among them, until acknowledged)" in lines
    assert "running   1 (from their execution records)" in lines
    [row] = [line for line in lines if message_id in line]
    assert row.split()[1] == "1" and row.endswith("s left")  # attempt 1, its lease live
    assert as_json.returncode == 0, as_json.stderr
    detail = json.loads(as_json.stdout)
    assert detail["agent_id"] == "show-worker-1" and detail["queued"] == {"P0": 0, "P1": 1, "P2": 0}
    [running] = detail["running"]
    assert (running["message_id"], running["attempt"]) == (message_id, 1)
    assert running["lease_until_ms"] > running["started_ms"] > 0
    assert json.loads(after.stdout)["running"] == []


async def test_show_of_an_agent_with_no_card_still_shows_its_queue(broker):
    """Tasks queued for an agent nobody registers (forgotten) are shown, not an error."""
    task = envelopes.Task(v=1, message_id="q-show-1", trace_id="q-show-1", topic="t")
    await broker.publish(broker.names.dispatch("ghost-1", "P2"), envelopes.encode(task))
    shown = await reach(broker, "agents", "show", "ghost-1")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:3] == [
        "agent     ghost-1: no card (never registered, or forgotten)",
        "queued    P0 0 · P1 0 · P2 1 (the running ones among them, until acknowledged)",
        "running   0 (from their execution records)",
    ]


async def test_show_refuses_an_agent_the_broker_knows_nothing_of_and_a_missing_id(broker):
    unknown = await reach(broker, "agents", "show", "nobody-at-all")
    missing = await reach(broker, "agents", "show")
    cleared_watch = await reach(broker, "agents", "clear", "x", "--watch", "1")
    assert unknown.returncode == 1
    assert "no agent 'nobody-at-all': no card, no task running or queued" in unknown.stderr
    assert missing.returncode == 2 and "agents show needs an agent's id" in missing.stderr
    assert cleared_watch.returncode == 1
    assert "--watch is for agents list or show, not clear" in cleared_watch.stderr


async def test_show_of_a_card_overwritten_by_a_server_answer_says_so(broker):
    """Anyone may aim a NATS server's answer at a card's key (an outside trial, with a
    caller's credentials): `reach agents` leaves the unreadable card out, and `show` said
    "no agent", as if it had never registered."""
    key = f"$KV.{broker.names.agents_bucket}.scribbled-2"
    await broker.publish_core("$JS.API.STREAM.NAMES", b"", reply=key)
    await broker.flush()

    async def overwritten() -> bool:
        counts, _ = await subject_counts(broker, f"KV_{broker.names.agents_bucket}", key)
        return bool(counts)

    await until_true(overwritten)
    shown = await reach(broker, "agents", "show", "scribbled-2")
    assert shown.returncode == 1
    assert "agent 'scribbled-2': its card is unreadable (" in shown.stderr
    assert "the agent writes its card again" in shown.stderr


def test_a_run_an_earlier_process_claimed_is_said_to_be_that_process_s():
    """After a kill -9 and a quick restart, the dead process's claim showed as a live run of
    the agent (a walkthrough): its epoch is older than the card's, and it says so."""
    record = envelopes.Execution(
        message_id="m-1", state="running", agent_id="a-1", epoch=2, started_ms=1_000,
        lease_until_ms=120_000, caller="billing",
    )  # fmt: skip
    queued = {"P0": 0, "P1": 1, "P2": 0}
    restarted = Row(
        "a-1", envelopes.AgentCard(agent_id="a-1", epoch=3, intents={}), None, None, None
    )
    same = Row("a-1", envelopes.AgentCard(agent_id="a-1", epoch=2, intents={}), None, None, None)
    [after_restart] = render(Detail("a-1", restarted, (record,), queued), 6_000).splitlines()[-1:]
    [still_running] = render(Detail("a-1", same, (record,), queued), 6_000).splitlines()[-1:]
    assert after_restart.split()[:5] == ["m-1", "1", "billing", "5.0s", "2"]
    assert after_restart.endswith("114.0s left, an earlier process's (it died or was restarted)")
    assert still_running.endswith("114.0s left")


async def test_show_says_which_runs_lapsed(broker):
    """A run's record whose lease lapsed (its process died, or stalled) counted as running
    beside a heartbeat saying no slot was busy."""
    await recorded(
        broker, "lapsed-run-1", "ghost-2", "running", lease_until_ms=envelopes.now_ms() - 5_000
    )
    shown = await reach(broker, "agents", "show", "ghost-2")
    assert shown.returncode == 0, shown.stderr
    assert (
        "running   1 (from their execution records; 1 of them lapsed: runs that died or stalled)"
        in shown.stdout.splitlines()
    )
