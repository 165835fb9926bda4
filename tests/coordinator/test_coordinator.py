"""The coordinator: shared work across replicas, nothing lost while it is down, config."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter

import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names
from agentreach.coordinator import (
    ConfigError,
    Coordinator,
    CoordinatorConfig,
    IntakeConfig,
    load_config,
)
from agentreach.coordinator.yaml_keys import twice_given
from agentreach.envelopes import AgentCard, Intent
from agentreach.envelopes.messages import DEFAULT_TTL_MS
from tests.cli.conftest import reach_argv, run
from tests.support import DISPATCHED, put_value


def counting_agent(agent_id: str, runs: Counter[str]) -> Agent:
    agent = Agent(agent_id, startup_delay=0)

    @agent.handler("count", capacity=8)
    async def count(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        return {"by": agent_id}

    return agent


@contextlib.asynccontextmanager
async def replica(broker: Broker):
    async with (
        Broker(broker.url, names=broker.names, name="replica") as own,
        Coordinator(own, CoordinatorConfig(intake=IntakeConfig(batch=4))).running() as running,
    ):
        yield running


async def test_two_replicas_share_intake_and_each_task_runs_once(broker, watcher):
    """With two coordinators and two agents, 40 tasks complete once each."""
    runs: Counter[str] = Counter()
    async with (
        replica(broker),
        replica(broker),
        counting_agent("count-a", runs).running(broker=broker),
        counting_agent("count-b", runs).running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        ids = [(await client.publish("count", {"i": i}))[0] for i in range(40)]
        for message_id in ids:
            await watcher.event("completed", message_id=message_id)
    assert set(runs) == set(ids)
    assert set(runs.values()) == {1}
    routed = [e for e in watcher.events if e.event == "routed"]
    assert len(routed) == 40


async def test_tasks_published_while_no_coordinator_runs_are_not_lost(broker, watcher):
    """Intake waits in REACH_TASKS until a coordinator starts, then every task completes."""
    runs: Counter[str] = Counter()
    async with ReachClient(broker=broker) as client:
        ids = [(await client.publish("count", {"i": i}))[0] for i in range(5)]
    async with counting_agent("late", runs).running(broker=broker), replica(broker):
        for message_id in ids:
            await watcher.event("completed", message_id=message_id)
    assert sorted(runs) == sorted(ids)


async def test_a_task_a_dead_replica_held_is_routed_by_another_after_the_intake_ack_wait(
    broker, watcher
):
    """A replica killed while it held a task (fetched, never settled) gives it up after the
    intake's ack wait, not after the task's ttl: another replica routes it, and it runs."""
    runs: Counter[str] = Counter()
    names = broker.names
    config = CoordinatorConfig(intake=IntakeConfig(ack_wait_s=1.0))
    async with (
        Broker(broker.url, names=names, name="replica") as own,
        Coordinator(own, config).running(),
    ):
        pass  # the intake consumer, as a replica makes it
    dead_replica = await broker.js.pull_subscribe_bind(
        names.coordinator_intake, stream=names.tasks_stream
    )
    async with ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("count", {"i": 1}, ttl_ms=8_000)
    [held] = await dead_replica.fetch(1, timeout=5)
    assert envelopes.decode_task(held.data).message_id == message_id
    async with (
        Broker(broker.url, names=names, name="replica") as own,
        Coordinator(own, config).running(),
        counting_agent("count-a", runs).running(broker=broker),
    ):
        await watcher.event("completed", message_id=message_id, timeout=6.0)
    assert runs == {message_id: 1}
    assert not watcher.dead_letters


def test_the_intake_ack_wait_is_well_inside_the_default_ttl():
    """What a dead replica held must come back while the task may still run."""
    assert IntakeConfig().ack_wait_s * 1000 * 3 <= DEFAULT_TTL_MS


async def test_a_card_written_a_moment_ago_is_found(broker, coordinator, watcher):
    """A miss re-reads the registry before deciding no_route."""
    card = AgentCard(agent_id="fresh", intents={"fresh_topic": Intent()})
    await put_value(broker, broker.names.agents_bucket, "fresh", envelopes.encode(card))
    async with ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("fresh_topic", {})
    routed = await watcher.event("routed", message_id=message_id)
    assert routed.agent_id == "fresh"


async def test_a_card_under_another_agent_s_key_draws_no_task(broker, coordinator, watcher):
    """An agent may write only its own key, but what it writes there could name another
    agent: such a card is not believed, so the other agent's tasks are not drawn into a
    queue nobody consumes (here: nobody else serves the topic, so `no_route` at once)."""
    spoof = AgentCard(agent_id="victim", intents={"victim_topic": Intent()})
    await put_value(broker, broker.names.agents_bucket, "spoofer", envelopes.encode(spoof))
    async with ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("victim_topic", {})
    letter = await watcher.dead_letter("no_route", message_id=message_id)
    assert letter.message_id == message_id
    assert not [e for e in watcher.events if e.event == "routed"]
    assert "victim" not in coordinator.directory.cards
    assert "spoofer" not in coordinator.directory.cards
    shown = await run(*reach_argv(broker, "agents"))
    assert "spoofer                IGNORED   its card names another agent, 'victim'" in shown.stdout


async def test_a_task_nobody_can_take_waits_within_its_ttl_then_expires(
    broker, coordinator, watcher
):
    """Agents of the topic exist but none is running: the task waits, then ends as expired,
    saying which agents could not take it and why."""
    runs: Counter[str] = Counter()
    async with counting_agent("gone", runs).running(broker=broker):
        pass  # registered, now stopped
    async with ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("count", {}, ttl_ms=300)
    letter = await watcher.dead_letter("expired", message_id=message_id)
    assert letter.error is not None
    assert letter.error.message.startswith(
        "ttl 300 ms passed in intake, waiting: no agent could take it for 'count' (gone: "
    ), letter.error.message
    assert "stopped" in letter.error.message
    assert letter.envelope is not None and letter.envelope.ttl_ms == 300
    assert not runs and letter.attempts == 0


async def test_a_waiting_task_runs_when_an_agent_comes_back(broker, coordinator, watcher):
    """While a task waits within its ttl, an agent that starts serving takes it."""
    runs: Counter[str] = Counter()
    agent = counting_agent("returning", runs)
    async with agent.running(broker=broker):
        pass
    async with ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("count", {}, ttl_ms=10_000)
    async with agent.running(broker=broker):
        await watcher.event("completed", message_id=message_id)
    assert runs[message_id] == 1


async def test_intake_expiry_uses_the_broker_timestamp(broker, watcher):
    """A task whose ttl passed before a coordinator read it is dead-lettered as expired."""
    async with ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("count", {}, ttl_ms=100)
    await asyncio.sleep(0.2)  # the ttl passing is what this test is about
    async with replica(broker):
        letter = await watcher.dead_letter("expired", topic="count")
    assert letter.message_id == message_id
    assert letter.error is not None and letter.error.message == "ttl 100 ms passed in intake"


async def test_a_retry_expiring_in_intake_says_what_was_left_of_its_ttl(broker, watcher):
    """A retry's ttl is what was left when it was scheduled: its expiry says so, and, when
    an earlier attempt began (not one moved unrun, `requeued`), that its effect may have
    happened: a task whose agent was killed mid-run expired as if nothing ran (an outside
    trial), for a compensation worker that reads the reason only."""
    for message_id, requeued in (("retried-1", 0), ("moved-unrun-1", 1)):
        retry = envelopes.Task(
            v=1, message_id=message_id, trace_id="t", topic="count", attempt=2,
            requeued=requeued, ttl_ms=100,
        )  # fmt: skip
        await broker.publish(
            broker.names.coordinator_task("count"), envelopes.encode(retry), headers=DISPATCHED
        )
    await asyncio.sleep(0.2)  # the ttl passing is what this test is about
    async with replica(broker):
        began = await watcher.dead_letter("expired", message_id="retried-1")
        unrun = await watcher.dead_letter("expired", message_id="moved-unrun-1")
    said = "its ttl passed in intake (100 ms of it were left when attempt 2 was scheduled)"
    assert began.error is not None and unrun.error is not None
    assert (
        began.error.message == f"{said}; an earlier attempt began, and its effect may have happened"
    )
    assert unrun.error.message == said


def test_config_file_errors_name_the_field(tmp_path):
    """A wrong value in the YAML config names its path; a missing file names the file."""
    bad = tmp_path / "coordinator.yaml"
    bad.write_text("intake: {batch: -3}\n")
    with pytest.raises(ConfigError, match=r"\$\.intake\.batch"):
        load_config(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("intake_bathc: 3\n")
    with pytest.raises(ConfigError, match="unknown field `intake_bathc`"):
        load_config(unknown)
    with pytest.raises(ConfigError, match="cannot read coordinator config"):
        load_config(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    good.write_text("intake: {batch: 8}\n")
    assert load_config(good).intake.batch == 8


def test_a_config_with_no_settings_or_a_limit_that_is_no_limit_is_refused(tmp_path):
    """An empty file (an editor's half-written save) was taken as the defaults, and a live
    reload replaced every rule with a fallback; a limit of 0 or below -1 was taken by the
    server as none at all (a trial)."""
    cases = {
        "": "holds no settings (empty, or comments only)",
        "# all rules moved\n": "holds no settings (empty, or comments only)",
        "limits: {events_bytes: -2}\n": "limits.events_bytes = -2: expected -1 (no limit) or 1",
        "limits: {record_bytes: 0}\n": "limits.record_bytes = 0: expected -1 (no limit) or 1",
    }
    for text, said in cases.items():
        path = tmp_path / "coordinator.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_config(path)
    path.write_text("limits: {events_bytes: -1, record_bytes: 1}\n")
    assert load_config(path).limits.record_bytes == 1


def test_a_mistake_in_a_keyed_section_names_the_key(tmp_path):
    """msgspec shows a dict's key as `[...]`: which caller's quota was wrong went unsaid (a
    trial). A workflow's were named already; every other keyed section now is too."""
    cases = {
        "rate_limits: {callers: {alice: {rate: 5, burst: 2}, default: {rate: -1, burst: 2}}}":
            "at `$.rate_limits.callers.default.rate`",
        "queues: {capacity: {P0: -3}}": "at `$.queues.capacity.P0`",
    }  # fmt: skip
    for text, said in cases.items():
        path = tmp_path / "coordinator.yaml"
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_config(path)


def test_a_wrong_value_is_said_with_its_line(tmp_path):
    """A YAML syntax error gave a line; a wrong value only its path (a trial)."""
    path = tmp_path / "coordinator.yaml"
    path.write_text("# quotas\nrate_limits:\n  callers:\n    default: {rate: -1, burst: 2}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).endswith("at `$.rate_limits.callers.default.rate` (line 4)")
    # The key at fault, not the first line of its section (a re-trial).
    for text, line in [
        ("limits:\n  events_bytes: -1\n  tasks_bytes: -7\n", 3),
        ("rate_limits:\n  callers:\n    default:\n      rate: 5\n      burts: 3\n", 5),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert str(caught.value).endswith(f"(line {line})"), caught.value


def test_an_unknown_field_is_said_with_the_one_it_may_have_meant(tmp_path):
    """`routes:` for `routing:` said only that `routes` was unknown (a fresh reader), where a
    workflow's mistakes name what was meant; each section's fields are looked at."""
    cases = {
        "routes: []\n": "unknown field `routes` (did you mean 'routing'?)",
        "liveness: {tik_s: 1}\n": "unknown field `tik_s` - at `$.liveness` (did you mean"
        " 'tick_s'?)",
        "zzz: 1\n": "unknown field `zzz`",
    }
    for n, (text, said) in enumerate(cases.items()):
        path = tmp_path / f"c{n}.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as error:
            load_config(path)
        assert str(error.value) == f"{path}: Object contains {said}"


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """YAML keeps the last of two equal keys: a second workflow `w` (or a second
    `delivery:` section) replaced the first, and `reach routes check` said nothing."""
    cases = {
        "workflows:\n  w: {chain: [{name: a, intent: x}]}\n"
        "  w: {chain: [{name: b, intent: y}]}\n": (
            "key 'w' is given twice in one mapping (lines 2 and 3)"
        ),
        "delivery: {max_attempts: 3}\nintake: {batch: 2}\ndelivery: {base_s: 1}\n": (
            "key 'delivery' is given twice in one mapping (lines 1 and 3)"
        ),
    }
    for n, (text, said) in enumerate(cases.items()):
        path = tmp_path / f"twice{n}.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as error:
            load_config(path)
        assert str(error.value).startswith(f"{path}: {said}: the second would replace")
    merged = b"base: &d {max_attempts: 3}\ndelivery: {<<: *d, <<: *d, base_s: 1}\n"
    assert twice_given(merged) is None  # merge keys are not keys given twice


def test_a_prefix_that_is_not_one_name_token_is_refused_naming_it(tmp_path):
    """`prefix: a.b` passed `reach routes check`, then `reach up` failed with a traceback
    (`invalid stream name: 'A.B_TASKS'`)."""
    path = tmp_path / "prefix.yaml"
    path.write_text('prefix: "a.b"\n')
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == (
        f"{path}: prefix 'a.b' is not one name token: 1 to 32 letters, digits, '_' or '-'"
        " (it begins every subject, stream and bucket name)"
    )
    with pytest.raises(ValueError, match="prefix 'a b' is not one name token"):
        Names(prefix="a b")


def test_flat_keys_of_the_old_layout_move_into_their_sections(tmp_path):
    """A 0.1 config (flat keys) still loads, each key in its section, and the move is logged."""
    old = tmp_path / "old.yaml"
    old.write_text("max_attempts: 5\nretry_base_s: 0.5\nliveness_tick_s: 2\nroutes_poll_s: 3\n")
    with capture_logs() as logs:
        config = load_config(old)
    assert config.delivery.max_attempts == 5 and config.delivery.base_s == 0.5
    assert config.liveness.tick_s == 2 and config.routing.reload_poll_s == 3
    (moved,) = [e for e in logs if e["event"].startswith("config keys moved")]
    assert "retry_base_s → delivery.base_s" in moved["moved"]


def test_the_config_s_limits_and_keep_days_make_its_topology(tmp_path):
    """`limits:`, `audit.keep_days` and `claim_check.keep_days` reach the streams, by the
    coordinator and by `reach provision --config` alike (one ran with what the other reset)."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(
        "limits: {tasks_bytes: 5000000, small_value_bytes: 8192}\n"
        "audit: {keep_days: 3}\nclaim_check: {keep_days: 2}\n"
    )
    names = Names()
    topology = load_config(str(path)).topology(names)
    streams = {s.name: s for s in topology.streams}
    assert streams[names.tasks_stream].max_bytes == 5_000_000
    assert streams[names.audit_stream].max_age_s == 3 * 86_400
    heartbeats = next(b for b in topology.buckets if b.name == names.heartbeats_bucket)
    assert heartbeats.max_value_bytes == 8192


async def test_a_sender_s_count_of_attempts_is_not_taken(broker, coordinator, watcher):
    """A caller's envelope said attempt 5: its task was routed as attempt 5, a retryable
    failure got no retry, and its letter said 5 attempts ran (a walkthrough). Refused at
    routing, it ran none. The same on the operators' bare subject."""
    for message_id, sender in (("counted-1", "alice"), ("counted-bare-1", None)):
        task = envelopes.Task(
            v=1, message_id=message_id, trace_id=message_id, topic="nobody-serves", attempt=5,
            requeued=3,
        )  # fmt: skip
        subject = broker.names.task("nobody-serves", sender)
        await broker.publish(subject, envelopes.encode(task))
        letter = await watcher.dead_letter("no_route", message_id=message_id)
        assert letter.envelope is not None
        assert (letter.envelope.attempt, letter.envelope.requeued, letter.attempts) == (1, 0, 0)
