"""`reach publish --count N`: a burst past the intake's backlog bound waits for room instead
of being dropped (as a core `nats pub --count` burst is), each task numbered by {{Count}}."""

from __future__ import annotations

import asyncio
import json

from agentreach.agents import Agent, TaskContext
from agentreach.broker import Topology, provision
from agentreach.broker.topology import StorageLimits
from tests.cli.conftest import reach_argv, run
from tests.e2e.routing_support import fast
from tests.support import until_true

BOUND = 5
BURST = 40


async def test_a_burst_past_the_bound_waits_for_room_and_each_runs_once(
    broker, start_coordinator, watcher
):
    """40 tasks through a bound of 5 per subject, sent while no coordinator takes any: the
    first 5 are stored and the rest wait for room; once a coordinator runs, every number
    from 1 to 40 runs once and the command ends well."""
    limits = StorageLimits(tasks_per_subject=BOUND)
    await provision(broker, Topology.default(broker.names, limits=limits))
    seen: list[int] = []
    agent = Agent("counter", startup_delay=0)

    @agent.handler("tally", capacity=4)
    async def tally(ctx: TaskContext, payload: dict) -> dict:
        seen.append(payload["n"])
        return {}

    argv = reach_argv(broker, "publish", "tally", '{"n": {{Count}}}', "--count", str(BURST))
    burst = asyncio.create_task(run(*argv))
    held = await until_true(lambda: _stored_is(broker, BOUND))
    async with agent.running(broker=broker), start_coordinator(fast(limits=limits)):
        sent = await burst
        ids = [json.loads(line)["message_id"] for line in sent.stdout.splitlines()]
        await watcher.until(
            lambda: len(watcher.ids_with("completed", set(ids))) == BURST, "the burst"
        )
    assert held and sent.returncode == 0, sent.stderr
    assert f"published {BURST} tasks on tally" in sent.stderr
    assert len(set(ids)) == BURST
    assert sorted(seen) == list(range(1, BURST + 1))


async def _stored_is(broker, count: int) -> bool:  # type: ignore[no-untyped-def]
    return (await broker.js.stream_info(broker.names.tasks_stream)).state.messages == count


async def test_count_is_refused_with_wait_or_a_message_id_and_a_bad_payload_sends_nothing(broker):
    """--count with --wait or --message-id is a usage error; so is JSON that is not valid once
    {{Count}} is numbered; nothing is published."""
    for extra in (("--wait",), ("--message-id", "one")):
        refused = await run(*reach_argv(broker, "publish", "t", "{}", "--count", "2", *extra))
        assert refused.returncode != 0 and "not with --wait or --message-id" in refused.stderr
    bad = await run(*reach_argv(broker, "publish", "t", '{"n": {{Count}}', "--count", "2"))
    assert bad.returncode != 0 and "JSON argument is not valid JSON" in bad.stderr
    zero = await run(*reach_argv(broker, "publish", "t", "{}", "--count", "0"))
    assert zero.returncode != 0 and "--count takes a number of tasks, 1 or more" in zero.stderr
    info = await broker.js.stream_info(broker.names.tasks_stream)
    assert info.state.messages == 0
