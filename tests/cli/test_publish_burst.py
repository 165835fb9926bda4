"""`reach publish --count N`: a burst past the intake's backlog bound waits for room instead
of being dropped (as a core `nats pub --count` burst is), each task numbered by {{Count}}."""

from __future__ import annotations

import asyncio
import json

import msgspec

from agentreach.agents import Agent, TaskContext
from agentreach.broker import Topology, provision, read_stream
from agentreach.broker.limits import StorageLimits
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
    assert bad.returncode != 0 and "the PAYLOAD argument is not valid JSON" in bad.stderr
    zero = await run(*reach_argv(broker, "publish", "t", "{}", "--count", "0"))
    assert zero.returncode != 0 and "--count takes a number of tasks, 1 or more" in zero.stderr
    info = await broker.js.stream_info(broker.names.tasks_stream)
    assert info.state.messages == 0


async def test_count_of_one_numbers_its_task_and_a_bad_count_is_said_before_the_payload(broker):
    """`{"n": {{Count}}}` with --count 1 failed as invalid JSON (the number was put in only
    above 1), and --count 0 with it said the JSON was bad rather than the count."""
    one = await run(*reach_argv(broker, "publish", "t", '{"n": {{Count}}}', "--count", "1"))
    assert one.returncode == 0, one.stderr
    [stored] = await read_stream(broker, broker.names.tasks_stream, broker.names.tasks_wildcard)
    assert msgspec.json.decode(stored.data)["payload"] == {"n": 1}
    zero = await run(*reach_argv(broker, "publish", "t", '{"n": {{Count}}}', "--count", "0"))
    assert zero.returncode != 0 and "--count takes a number of tasks, 1 or more" in zero.stderr


async def test_publish_says_a_message_id_stored_already_was_not_taken_in_again(broker):
    """The same --message-id again (another payload) printed its id and exited 0 saying
    nothing, and the second payload never ran: the stream dropped it as a duplicate."""
    first = await run(*reach_argv(broker, "publish", "t", '{"v": 1}', "--message-id", "dup-1"))
    again = await run(*reach_argv(broker, "publish", "t", '{"v": 2}', "--message-id", "dup-1"))
    assert first.returncode == 0 and "not taken in" not in first.stderr, first.stderr
    assert again.returncode == 0, again.stderr
    assert "task not taken in: its message id was stored already" in again.stderr
    stored = await read_stream(broker, broker.names.tasks_stream, broker.names.tasks_wildcard)
    assert len(stored) == 1
