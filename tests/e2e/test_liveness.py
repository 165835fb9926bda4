"""Liveness through a real server and real agent processes, with short intervals (0.2 s)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, AgentIdInUse, ReachClient, TaskContext
from agentreach.agents.runtime import CARD_LOOK_BEATS
from agentreach.broker import Broker, BucketWatch, EmbeddedServer, Topology, provision
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator import Coordinator, CoordinatorConfig, DeliveryConfig, LivenessConfig
from agentreach.envelopes import (
    AgentCard,
    Heartbeat,
    Intent,
    Liveness,
    RegisterReply,
    RegisterRequest,
    Task,
    decode_as,
    encode,
    now_ms,
)
from tests.cli.conftest import reach_argv, run
from tests.support import DISPATCHED, eventually, put_value, stopped, wait_for_card

REPO = Path(__file__).parents[2]
INTERVAL = 0.2
LIVELY = CoordinatorConfig(
    liveness=LivenessConfig(
        tick_s=0.05, probe_connection_s=0.3, probe_ping_s=0.3, probe_retry_s=0.3
    ),
    delivery=DeliveryConfig(base_s=0.05, cap_s=0.2),
    lease_ttl_s=0.6,
)


def lively(**liveness: object) -> CoordinatorConfig:
    """LIVELY with some of its liveness settings changed."""
    changed = msgspec.structs.replace(LIVELY.liveness, **liveness)
    return msgspec.structs.replace(LIVELY, liveness=changed)


@contextlib.asynccontextmanager
async def lively_coordinator(broker: Broker, config: CoordinatorConfig = LIVELY):
    async with (
        Broker(broker.url, names=broker.names, name="coordinator") as own,
        Coordinator(own, config).running() as running,
    ):
        yield running


@pytest.fixture
async def coordinator(broker) -> AsyncIterator[Coordinator]:
    async with lively_coordinator(broker) as running:
        yield running


@contextlib.asynccontextmanager
async def pulse_process(
    broker: Broker,
    agent_id: str,
    *,
    epoch: int = 0,
    stderr: int = asyncio.subprocess.DEVNULL,
    interval_s: float = INTERVAL,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`reach agent tests.e2e.pulse:agent` as its own process, serving until the block ends
    (once its card, of at least ``epoch``, is running)."""
    env = {**os.environ, "PULSE_ID": agent_id, "PULSE_INTERVAL": str(interval_s)}
    process = await asyncio.create_subprocess_exec(
        *reach_argv(broker, "agent", "tests.e2e.pulse:agent"),
        cwd=REPO,
        env=env,
        stderr=stderr,
    )
    try:
        await wait_for_card(broker, agent_id, status="running", epoch=epoch)
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()


def local_agent(agent_id: str, **options: object) -> Agent:
    agent = Agent(agent_id, startup_delay=0, heartbeat_interval=INTERVAL, **options)  # type: ignore[arg-type]

    @agent.handler("noop")
    async def noop(ctx: TaskContext, payload: object) -> object:
        return payload

    return agent


async def test_killed_agent_goes_suspect_then_offline_in_time(broker, coordinator, watcher):
    """kill -9: SUSPECT after 3 intervals, OFFLINE as soon as the probe finds no connection."""
    async with pulse_process(broker, "doomed") as process:
        await watcher.state("doomed", "ONLINE")
        process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await watcher.state("doomed", "SUSPECT")
        suspect_after = time.monotonic() - killed
        offline = await watcher.state("doomed", "OFFLINE")
        offline_after = time.monotonic() - killed
    budget = 3 * INTERVAL * 1.2 + LIVELY.liveness.tick_s + 0.3  # jitter, sweep, scheduling
    assert suspect_after <= budget
    probes = LIVELY.liveness
    assert offline_after <= budget + 2 * probes.probe_connection_s + probes.probe_retry_s
    assert offline.detail["reason"] == "connection gone"


async def test_blocked_loop_is_unresponsive_not_offline(broker, coordinator, watcher):
    """An agent whose event loop is held is SUSPECT `unresponsive`, and ONLINE again after."""
    async with pulse_process(broker, "stuck"), ReachClient(broker=broker) as client:
        await watcher.state("stuck", "ONLINE")
        result = await client.invoke("block", {"seconds": 3.0}, execute_deadline_ms=20_000)
        unresponsive = await watcher.state("stuck", "SUSPECT", reason="unresponsive")
        back = await watcher.state("stuck", "ONLINE", after=unresponsive)
    assert result == {"blocked": 3.0}
    states = [(e.detail["state"], e.detail["reason"]) for e in watcher.states("stuck")]
    assert ("OFFLINE", "no heartbeat for 5 intervals") not in states
    assert all(state != "OFFLINE" for state, _ in states)
    assert back.detail["was"] == "SUSPECT"


async def test_a_stopped_agent_holding_work_is_unresponsive_within_two_checks(
    broker, coordinator, watcher
):
    """SIGSTOP on an agent that beats every 20 s, with a task queued for it: its connection
    stays, so presence checks time out. Twice in a row, with no heartbeat between, it is
    SUSPECT `unresponsive` with an alert, seconds in, not after 3 intervals (60 s, its task
    expired meanwhile); SIGCONT and its next heartbeat make it ONLINE again."""
    async with (
        pulse_process(broker, "frozen", interval_s=20.0) as process,
        ReachClient(broker=broker) as client,
    ):
        await watcher.state("frozen", "ONLINE")
        process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            await client.publish("block", {"seconds": 0}, ttl_ms=60_000)
            unresponsive = await watcher.state("frozen", "SUSPECT", reason="unresponsive")
            after_s = time.monotonic() - stopped
            alert = await watcher.until(
                lambda: next((e for e in watcher.events if e.event == "alert"), None), "alert"
            )
        finally:
            process.send_signal(signal.SIGCONT)
        back = await watcher.state("frozen", "ONLINE", after=unresponsive)
    assert after_s < 10, f"unresponsive after {after_s:.1f} s"
    assert alert.agent_id == "frozen" and alert.detail["problem"] == "unresponsive"
    assert back.detail["was"] == "SUSPECT"


async def test_what_a_stopped_agent_never_claimed_goes_to_a_peer_at_once(
    broker, coordinator, watcher
):
    """A SIGSTOPped agent kept the tasks queued for it until OFFLINE (20 intervals: 5 min by
    default), and they expired while a healthy peer idled (an on-call drill). At SUSPECT
    `unresponsive` what it never claimed goes to another agent; once back, it runs none."""
    peer = Agent("peer", startup_delay=0, heartbeat_interval=INTERVAL)

    @peer.handler("block")
    async def block(ctx: TaskContext, payload: dict) -> dict:
        return {"blocked": 0}

    async with (
        pulse_process(broker, "frozen", interval_s=20.0) as process,
        ReachClient(broker=broker) as client,
    ):
        await watcher.state("frozen", "ONLINE")
        await stopped(process.pid)
        try:
            ids = [await client.publish("block", {"seconds": 0}, ttl_ms=60_000) for _ in "abc"]
            sent = {message_id for message_id, _ in ids}
            unresponsive = await watcher.state("frozen", "SUSPECT", reason="unresponsive")
            async with peer.running(broker=broker):
                await watcher.until(lambda: watcher.ids_with("completed", sent) == sent or None,
                                    "the three completed")  # fmt: skip
        finally:
            process.send_signal(signal.SIGCONT)
        await watcher.state("frozen", "ONLINE", after=unresponsive)
    moved = [e for e in watcher.events if e.event == "retry_scheduled"]
    assert {e.message_id for e in moved} == sent
    assert all(
        e.detail["error"]["message"] == "frozen stopped answering before it ran" for e in moved
    )
    ran = [e.agent_id for e in watcher.events if e.event == "completed"]
    assert ran == ["peer"] * 3


async def test_an_agent_silent_and_connected_is_unresponsive_after_one_probe(
    broker, coordinator, watcher
):
    """SUSPECT for missed heartbeats, its connection there and its presence unanswered: it
    is unresponsive after that one question. A second probe, and a ping after a presence
    unanswered, took 8 s more each by default while what was queued for it waited (a
    drill: unresponsive at +23 s, not +7 s)."""
    asked: list[int] = []

    async def heard(msg) -> None:  # type: ignore[no-untyped-def]
        asked.append(now_ms())

    presence = await broker.nc.subscribe(broker.names.presence("stopped-idle"), cb=heard)
    pings = await broker.nc.subscribe(broker.names.ping("stopped-idle"))
    async with pulse_process(broker, "stopped-idle") as process:
        await watcher.state("stopped-idle", "ONLINE")
        await stopped(process.pid)
        try:
            missed = await watcher.state("stopped-idle", "SUSPECT", reason="missed heartbeats")
            found = await watcher.state("stopped-idle", "SUSPECT", reason="unresponsive")
        finally:
            process.send_signal(signal.SIGCONT)
    assert len([t for t in asked if missed.at_ms <= t <= found.at_ms]) == 1
    assert pings.pending_msgs == 0
    await presence.unsubscribe()
    await pings.unsubscribe()


async def test_busy_cpu_bound_sync_handler_stays_online(broker, coordinator, watcher):
    """Two seconds of CPU-bound work in a sync handler: heartbeats keep flowing."""
    async with pulse_process(broker, "busy"), ReachClient(broker=broker) as client:
        await watcher.state("busy", "ONLINE")
        result = await client.invoke("burn", {"seconds": 2.0}, execute_deadline_ms=20_000)
    assert result == {"burned": 2.0}
    assert [e.detail["state"] for e in watcher.states("busy")] == ["ONLINE"]


async def test_restart_with_the_same_id_is_online_with_a_new_epoch(broker, coordinator, watcher):
    """Same id again: one record, epoch + 1, ONLINE; a second live process is refused."""
    agent = local_agent("phoenix")
    async with agent.running(broker=broker):
        await watcher.state("phoenix", "ONLINE")
        with pytest.raises(AgentIdInUse, match="in use by another live process"):
            async with local_agent("phoenix").running(broker.url, names=broker.names):
                pass
    async with agent.running(broker=broker) as again:
        await _until(lambda: _liveness(coordinator, "phoenix", again.card.epoch))
    kv = await broker.kv(broker.names.agents_bucket)
    card = msgspec.json.decode((await kv.get("phoenix")).value, type=AgentCard)
    assert card.epoch == 2
    states = [(e.detail["state"], e.detail["reason"]) for e in watcher.states("phoenix")]
    assert states[:3] == [("ONLINE", "heartbeat"), ("OFFLINE", "stopped"), ("ONLINE", "heartbeat")]


async def test_a_card_deleted_or_overwritten_by_hand_is_written_again(broker, coordinator, watcher):
    """A live agent whose card is gone from the registry (`nats kv del`) or unreadable
    (written over by hand) writes it again within a few heartbeat intervals, and is routed
    to again: it was left out of routing while it went on beating, every task `no_route`."""
    kv = await broker.kv(broker.names.agents_bucket)
    async with (
        local_agent("scribbled").running(broker=broker) as running,
        ReachClient(broker=broker) as client,
    ):
        await watcher.state("scribbled", "ONLINE")
        assert running.card is not None
        for damage in (kv.put("scribbled", b"garbage-card"), kv.delete("scribbled")):
            await damage
            async with asyncio.timeout(CARD_LOOK_BEATS * INTERVAL * 1.2 + 5):
                card = await _readable_card(broker, "scribbled")
            assert card == running.card
            assert await client.invoke("noop", {"n": 1}) == {"n": 1}


async def _readable_card(broker: Broker, agent_id: str) -> AgentCard:
    """The agent's next readable card (the value there now first)."""
    async with BucketWatch(await broker.kv(broker.names.agents_bucket)) as watch:
        async for change in watch:
            if change.key == agent_id and change.value is not None:
                with contextlib.suppress(msgspec.DecodeError):
                    return msgspec.json.decode(change.value, type=AgentCard)
    raise AssertionError("the watch ended")


async def test_a_stalled_process_replaced_by_a_newer_one_stops_when_it_resumes(
    broker, coordinator, watcher
):
    """SIGSTOP, then a new process of the same id (the stalled one cannot answer the
    presence check, so the new one registers at epoch 2), then SIGCONT: the stalled process
    finds the newer heartbeat over its own, takes no more work and exits with a one-line
    error; the newer process serves alone, its card and heartbeat untouched."""
    async with pulse_process(broker, "stalled", stderr=asyncio.subprocess.PIPE) as old:
        await watcher.state("stalled", "ONLINE")
        old.send_signal(signal.SIGSTOP)
        async with (
            pulse_process(broker, "stalled", epoch=2) as new,
            ReachClient(broker=broker) as client,
        ):
            old.send_signal(signal.SIGCONT)
            await asyncio.wait_for(old.wait(), timeout=10.0)
            assert old.stderr is not None
            said = (await old.stderr.read()).decode()
            result = await client.invoke("burn", {"seconds": 0.01})
            kv = await broker.kv(broker.names.agents_bucket)
            card = msgspec.json.decode((await kv.get("stalled")).value, type=AgentCard)
            assert new.returncode is None
    assert old.returncode == 1
    assert "was registered again by a newer process (epoch 2; this one's 1)" in said
    assert result == {"burned": 0.01}
    assert (card.epoch, card.status) == (2, "running")


async def test_skewed_clock_sends_clock_drift_and_changes_nothing(broker, coordinator, watcher):
    """An agent whose wall clock jumps 10 s: a clock_drift event, and it stays ONLINE."""
    jumps = iter([0.0] + [10.0] * 10_000)
    agent = local_agent("skewed", clock=lambda: time.time() + next(jumps))
    async with agent.running(broker=broker):
        drift = await watcher.event("clock_drift", topic="_agent")
        await asyncio.sleep(5 * INTERVAL)  # several heartbeats: the judgement must not move
    assert drift.agent_id == "skewed" and drift.detail["drift_s"] >= 5
    assert [e.detail["state"] for e in watcher.states("skewed")][:1] == ["ONLINE"]
    assert "SUSPECT" not in [e.detail["state"] for e in watcher.states("skewed")]


async def test_tasks_of_a_lost_agent_complete_elsewhere_and_its_late_result_is_rejected(
    broker, coordinator, watcher
):
    """An agent gone silent mid-task: the task completes once on another agent; the old
    agent's late result is fenced off."""
    release = asyncio.Event()
    lost, spare = Agent("lost", startup_delay=0, heartbeat_interval=INTERVAL), local_agent("spare")
    runs: list[str] = []

    @lost.handler("noop", deadline_ms=30_000)
    async def slow_noop(ctx: TaskContext, payload: object) -> object:
        runs.append("lost")
        await release.wait()
        return {"by": "lost"}

    async with lost.running(broker=broker) as lost_runtime, ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("noop", {"n": 1})
        await watcher.event("accepted", message_id=message_id)
        # The agent vanishes from the coordinator's view (a partition), its handler still running.
        lost_runtime._duties[0].cancel()
        await lost_runtime._presence.stop()
        await watcher.state("lost", "OFFLINE")
        async with spare.running(broker=broker):
            done = await watcher.event("completed", message_id=message_id)
            release.set()
            await watcher.event("late_result_rejected", message_id=message_id)
    assert done.agent_id == "spare" and done.attempt == 2
    assert [e.agent_id for e in watcher.events if e.event == "completed"] == ["spare"]
    # The trace says why attempt 2 came: its agent went OFFLINE.
    moved = await watcher.event("retry_scheduled", message_id=message_id)
    assert moved.detail["next_attempt"] == 2 and moved.detail["delay_ms"] == 0
    assert moved.detail["error"]["type"] == "reassigned"
    assert moved.detail["error"]["message"] == "lost went OFFLINE while running it"


async def test_coordinator_restart_causes_no_false_offline(broker, watcher):
    """Restarting the coordinator keeps live agents ONLINE: grace, not mass OFFLINE."""
    async with local_agent("steady").running(broker=broker):
        async with lively_coordinator(broker):
            await watcher.state("steady", "ONLINE")
        await asyncio.sleep(6 * INTERVAL)  # longer than the offline threshold, no coordinator
        async with lively_coordinator(broker):
            await asyncio.sleep(6 * INTERVAL)  # a full threshold under the new coordinator
    assert [e.detail["state"] for e in watcher.states("steady")] == ["ONLINE"]


async def test_many_agents_register_together_within_the_rate_limit(broker, watcher):
    """200 agents at once against a limit of 50/s (burst 10): all register, none crash."""
    config = lively(registration_rate=50.0, registration_burst=10)
    # A slow heartbeat: 200 agents beating every 0.2 s would only measure this one process.
    agents = [Agent(f"crowd-{i:03d}", startup_delay=0, heartbeat_interval=5.0) for i in range(200)]
    for agent in agents:
        agent.handler("noop")(_noop)
    running = [a.running(broker=broker) for a in agents]
    async with lively_coordinator(broker, config):
        await asyncio.gather(*(r.__aenter__() for r in running))
        kv = await broker.kv(broker.names.agents_bucket)
        cards = [
            msgspec.json.decode((await kv.get(a.agent_id)).value, type=AgentCard) for a in agents
        ]
        await asyncio.gather(*(r.__aexit__(None, None, None) for r in running))
    assert all(card.status == "running" for card in cards)
    # Cards are written a moment after their slot is granted, by 200 agents in one process:
    # over 2 s that moment (up to 200 ms on a busy machine) cannot decide the bound.
    started = sorted(card.started_at for card in cards)
    busiest = max(sum(1 for t in started if s <= t < s + 2000) for s in started)
    assert busiest <= 10 + 2 * 50 + 15  # burst + two seconds of refill, and the moment
    assert started[-1] - started[0] >= 2000  # the crowd was spread, not let in at once


async def test_agents_refused_a_registration_slot_are_given_turns_one_after_another(broker):
    """A refused agent was told when the next token comes (20 ms at 50/s): a crowd of 200
    came back together, every 20 ms, 10,000 requests a second for 50 slots. Each refused one
    is now given the turn after those given before it."""
    config = lively(registration_rate=50.0, registration_burst=10)
    async with lively_coordinator(broker, config):
        asking = [_register(broker, f"turn-{i:02d}") for i in range(30)]
        replies = await asyncio.gather(*asking)
    refused = [reply.retry_after_ms for reply in replies if not reply.ok]
    assert len(refused) >= 19  # the burst of 10 granted, perhaps one token refilled
    turns = sorted(refused)
    assert all(later - earlier >= 19 for earlier, later in itertools.pairwise(turns)), turns
    assert turns[-1] >= 18 * 20, turns  # the last one's turn is about 19 slots away


async def _register(broker: Broker, agent_id: str) -> RegisterReply:
    request = encode(RegisterRequest(agent_id=agent_id))
    answer = await broker.request(broker.names.register(agent_id), request, timeout=5)
    return decode_as(answer.data, RegisterReply)


async def _noop(ctx: TaskContext, payload: object) -> object:
    return payload


def _liveness(coordinator: Coordinator, agent_id: str, epoch: int) -> bool:
    record: Liveness | None = coordinator.directory.liveness.get(agent_id)
    return record is not None and record.state == "ONLINE" and record.epoch == epoch


async def _until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - an in-memory view has no event of its own
            await asyncio.sleep(0.02)


async def test_a_heartbeat_missed_by_the_watch_is_found_by_the_reread(broker):
    """The periodic re-read takes in heartbeats a stalled watch never delivered."""
    from agentreach.coordinator.liveness.monitor import LivenessMonitor
    from agentreach.envelopes import Heartbeat, encode

    monitor = LivenessMonitor(broker, LIVELY.liveness)
    await put_value(
        broker,
        broker.names.heartbeats_bucket,
        "unseen",
        encode(Heartbeat(agent_id="unseen", epoch=3, seq=1, interval_s=1.0)),
    )
    await monitor.reread()
    assert monitor.agents["unseen"].state == "ONLINE"
    assert monitor.agents["unseen"].epoch == 3
    before = monitor.agents["unseen"].since_ms
    await monitor.reread()  # nothing new: no second transition
    assert monitor.agents["unseen"].since_ms == before


@pytest.mark.parametrize(
    ("key", "beat"),
    [
        ("forever", {"agent_id": "forever", "epoch": 1, "seq": 1, "interval_s": 1e9}),
        ("never", {"agent_id": "never", "epoch": 1, "seq": 1, "interval_s": 0}),
        ("posing", {"agent_id": "someone-else", "epoch": 1, "seq": 1, "interval_s": 1.0}),
    ],
)
async def test_a_heartbeat_it_cannot_use_counts_as_none(broker, key: str, beat: dict) -> None:
    """A beat claiming a billion-second interval (a dead agent ONLINE for good), a zero one,
    or one naming another agent than its key is not taken: the agent stays as it was."""
    from agentreach.coordinator.liveness.monitor import LivenessMonitor

    monitor = LivenessMonitor(broker, LIVELY.liveness)
    await put_value(broker, broker.names.heartbeats_bucket, key, msgspec.json.encode(beat))
    await monitor.reread()
    assert key not in monitor.agents or monitor.agents[key].state != "ONLINE"


async def test_a_heartbeat_the_watch_missed_is_read_again_before_judging(broker):
    """An agent silent to the watch but with a fresh heartbeat in the bucket stays ONLINE;
    one with none is judged SUSPECT."""
    from agentreach.coordinator.liveness.monitor import LivenessMonitor, Tracked
    from agentreach.envelopes import Heartbeat, encode

    monitor = LivenessMonitor(broker, LIVELY.liveness)
    await put_value(
        broker,
        broker.names.heartbeats_bucket,
        "quiet",
        encode(Heartbeat(agent_id="quiet", epoch=1, seq=1, interval_s=1.0)),
    )
    long_ago = time.monotonic() - 10
    for agent_id in ("quiet", "gone"):
        monitor.agents[agent_id] = Tracked(agent_id, 1.0, long_ago, state="ONLINE")
    await monitor.sweep()
    probe = monitor.agents["gone"].probe
    assert probe is not None
    await cancel_and_wait(probe)
    assert monitor.agents["quiet"].state == "ONLINE"
    assert monitor.agents["quiet"].last_seen > long_ago + 5
    assert monitor.agents["gone"].state == "SUSPECT"


async def test_one_replica_judges_liveness_and_another_takes_over(broker, watcher):
    """Two coordinators: one holds the liveness lease; when it stops, the other judges."""
    async with local_agent("watched").running(broker=broker) as runtime:
        async with lively_coordinator(broker) as first, lively_coordinator(broker) as second:
            await watcher.state("watched", "ONLINE")
            leaders = [c for c in (first, second) if "watched" in c.liveness.agents]
            assert len(leaders) == 1
        async with lively_coordinator(broker) as survivor:
            runtime._duties[0].cancel()  # heartbeats stop: the survivor must notice
            await runtime._presence.stop()
            offline = await watcher.state("watched", "OFFLINE")
        assert "watched" in survivor.liveness.agents
    assert offline.detail["reason"] == "connection gone"
    assert [e.detail["state"] for e in watcher.states("watched")][:1] == ["ONLINE"]


async def test_an_agent_away_for_less_than_a_reconnect_is_not_declared_offline(broker, watcher):
    """After a server restart a live agent is missing from the server until its reconnect
    backoff has run: a probe that finds no connection looks again ``probe_retry_s`` later,
    and an agent back by then is ONLINE again, its tasks never reassigned."""
    config = lively(probe_retry_s=3.0)
    async with (
        lively_coordinator(broker, config),
        local_agent("away").running(broker=broker) as runtime,
    ):
        await watcher.state("away", "ONLINE")
        # What the server sees of a client that is reconnecting: no subscription, no beats.
        assert runtime.heartbeats is not None and runtime._presence is not None
        runtime._duties[0].cancel()
        await runtime._presence.stop()
        suspect = await watcher.state("away", "SUSPECT")
        await asyncio.sleep(1.0)  # the fault itself: away for a second after the first probe
        await runtime._presence.start()
        runtime._duties[0] = asyncio.create_task(runtime.heartbeats.run())
        back = await watcher.state("away", "ONLINE", after=suspect)
        states = [e.detail["state"] for e in watcher.states("away")]
    assert back.detail["was"] == "SUSPECT"
    assert "OFFLINE" not in states


async def test_an_idle_agent_is_told_to_beat_less_often(broker, watcher):
    """After a few idle beats the coordinator doubles the agent's interval; it complies."""
    config = lively(adaptive_beats=3)
    async with (
        lively_coordinator(broker, config) as coordinator,
        local_agent("idler").running(broker=broker) as runtime,
    ):
        await _until(lambda: runtime.heartbeats.interval_s == 2 * INTERVAL)
        await _until(lambda: coordinator.liveness.agents["idler"].interval_s == 2 * INTERVAL)
    assert [e.detail["state"] for e in watcher.states("idler")][:1] == ["ONLINE"]


async def test_an_agent_that_keeps_going_offline_is_quarantined_until_cleared(broker, watcher):
    """More than 3 OFFLINE in an hour: quarantined, no work, until `agents clear`; `reach
    agents` says so and how to lift it (it showed `QUARANT.` alone, the count 0 isolated)."""
    agent = local_agent("flaky-link")
    async with lively_coordinator(broker) as coordinator:
        for _ in range(4):
            async with agent.running(broker=broker) as runtime:
                online = await watcher.state("flaky-link", "ONLINE", after=_last(watcher))
                runtime._duties[0].cancel()  # the link drops: no heartbeat, no presence
                await runtime._presence.stop()
                await watcher.state("flaky-link", "OFFLINE", after=online)
        record = coordinator.liveness.agents["flaky-link"]
        assert record.quarantined
        listed = await run(*reach_argv(broker, "agents"))
        assert "reach agents clear flaky-link" in listed.stdout, listed.stdout  # why, and how
        assert "1 quarantined" in listed.stdout.splitlines()[-1], listed.stdout
        # Its own card deleted while it is down (its permissions allow it) made it forgotten,
        # and its next process started unquarantined (a security re-test).
        cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
        await cards.delete("flaky-link")
        await _until(lambda: "flaky-link" not in coordinator.directory.cards)
        async with agent.running(broker=broker), ReachClient(broker=broker) as client:
            await _until(lambda: _state(coordinator, "flaky-link") == "ONLINE")
            card = coordinator.directory.cards["flaky-link"]
            assert not coordinator.directory.can_take_work(card)
            assert coordinator.liveness.agents["flaky-link"].quarantined
            cleared = await broker.nc.request(broker.names.clear, b"flaky-link", timeout=5)
            assert cleared.data == b"cleared"
            await _until(
                lambda: coordinator.directory.can_take_work(
                    coordinator.directory.cards["flaky-link"]
                )
            )
            assert await client.invoke("noop", {"ok": 1}) == {"ok": 1}


async def test_an_agent_killed_and_started_again_before_it_was_judged_went_offline(broker, watcher):
    """Killed -9 and started again within its heartbeat interval: the coordinator saw a new
    process's beat, and nothing else. It was never OFFLINE, so an agent crashing every 19 s
    was never quarantined (an outside trial). A new process whose last one went unannounced
    is an OFFLINE (`restarted`), counted as one, then ONLINE."""
    async with lively_coordinator(broker) as coordinator:
        async with pulse_process(broker, "phoenix", interval_s=5.0) as first:
            online = await watcher.state("phoenix", "ONLINE")
            epoch = coordinator.liveness.agents["phoenix"].epoch
            first.send_signal(signal.SIGKILL)
            await first.wait()
        async with pulse_process(broker, "phoenix", epoch=epoch + 1, interval_s=5.0):
            offline = await watcher.state("phoenix", "OFFLINE", after=online)
            await watcher.state("phoenix", "ONLINE", after=offline)
        tracked = coordinator.liveness.agents["phoenix"]
    assert offline.detail["reason"] == "restarted"
    assert len(tracked.offline_at_ms) == 1  # toward its quarantine


async def test_a_restart_just_after_an_outage_is_not_counted_toward_quarantine(tmp_path):
    """Its process ended while the server was away (a SIGTERM in an outage cannot mark its
    card stopped), and a new one came once it was back: four such restarts in an hour had
    the agent quarantined (an outside trial). Still OFFLINE, as `restarted after an outage`,
    not counted."""
    async with (
        EmbeddedServer(port=-1, store_dir=tmp_path / "nats") as server,
        Broker(server.url, name="test") as broker,
    ):
        await provision(broker, Topology.default(broker.names))
        async with lively_coordinator(broker) as coordinator:
            async with pulse_process(broker, "phoenix-3", interval_s=5.0) as first:
                await eventually(lambda: _state(coordinator, "phoenix-3") == "ONLINE")
                epoch = coordinator.liveness.agents["phoenix-3"].epoch
                await server.stop()
                first.send_signal(signal.SIGKILL)  # gone in the outage
                await first.wait()
            await server.restart()
            await eventually(lambda: coordinator.broker.reconnects > 0, timeout=15)
            with capture_logs() as logs:
                async with pulse_process(broker, "phoenix-3", epoch=epoch + 1, interval_s=5.0):
                    tracked = coordinator.liveness.agents["phoenix-3"]
                    await eventually(lambda: tracked.epoch > epoch and tracked.state == "ONLINE")
    offline = [e["reason"] for e in logs if e["event"] == "liveness" and e["state"] == "OFFLINE"]
    assert offline == ["restarted after an outage"]
    assert tracked.offline_at_ms == [] and not tracked.quarantined


async def test_a_restart_moves_only_the_queue_of_the_process_that_died(
    broker, watcher, monkeypatch: pytest.MonkeyPatch
):
    """The new process's card was tracked while the `restarted` verdict was written (the
    sweep runs meanwhile): the queue move took the new process's epoch, moved the tasks it
    had claimed, and they ran twice (a chaos run); the beat's judge then crashed on the
    reset tracking. The move is of the epoch judged, which a newer process outranks."""
    moved: list[tuple[str, int]] = []
    async with lively_coordinator(broker) as coordinator:
        liveness = coordinator.liveness
        move, written = liveness.moves.move, liveness._verdicts.written

        async def recorded(agent_id: str, epoch: int, **options: object) -> None:
            moved.append((agent_id, epoch))
            await move(agent_id, epoch, **options)  # type: ignore[arg-type]

        async def swept_meanwhile(timeout_s: float) -> bool:
            done = await written(timeout_s)
            # The sweep, between the verdict and the move, once the new card is known.
            await eventually(lambda: coordinator.directory.cards["phoenix-2"].epoch > epoch)
            liveness._track_registered()
            return done

        monkeypatch.setattr(liveness.moves, "move", recorded)
        async with pulse_process(broker, "phoenix-2", interval_s=5.0) as first:
            online = await watcher.state("phoenix-2", "ONLINE")
            epoch = liveness.agents["phoenix-2"].epoch
            first.send_signal(signal.SIGKILL)
            await first.wait()
        monkeypatch.setattr(liveness._verdicts, "written", swept_meanwhile)
        with capture_logs() as logs:
            async with pulse_process(broker, "phoenix-2", epoch=epoch + 1, interval_s=5.0):
                offline = await watcher.state("phoenix-2", "OFFLINE", after=online)
                await watcher.state("phoenix-2", "ONLINE", after=offline)
    assert offline.detail["reason"] == "restarted"
    assert moved == [("phoenix-2", epoch)]
    assert not [
        line for line in logs if line["event"] == "a coordinator loop failed; starting it again"
    ]


def _state(coordinator, agent_id: str) -> str | None:  # type: ignore[no-untyped-def]
    tracked = coordinator.liveness.agents.get(agent_id)
    return tracked.state if tracked is not None else None


def _last(watcher):  # type: ignore[no-untyped-def]
    states = watcher.states("flaky-link")
    return states[-1] if states else None


async def test_a_silent_wildcard_subscriber_neither_blocks_a_start_nor_keeps_the_dead(
    broker, coordinator, watcher
):
    """A `nats sub '>'`-like subscriber on the presence subject answers nothing: the agent
    still starts, and once killed it still goes OFFLINE (after the unresponsive limit)."""
    listener = await broker.nc.subscribe(f"{broker.names.prefix}.presence.>")
    try:
        async with pulse_process(broker, "overheard") as process:
            await watcher.state("overheard", "ONLINE")
            process.send_signal(signal.SIGKILL)
            suspect = await watcher.state("overheard", "SUSPECT", reason="unresponsive")
            limit = LIVELY.liveness.unresponsive_intervals
            offline = await watcher.state("overheard", "OFFLINE", after=suspect, timeout=20)
    finally:
        await listener.unsubscribe()
    assert offline.detail["reason"] == f"no heartbeat for {limit} intervals"


async def test_a_coordinator_restart_does_not_bring_a_dead_agent_back(broker, watcher):
    """An agent gone long ago left its last heartbeat in KV: a new coordinator (or a new
    holder of the liveness lease) reads it as old, not as a sign of life."""
    async with lively_coordinator(broker), pulse_process(broker, "ghost") as process:
        await watcher.state("ghost", "ONLINE")
        process.send_signal(signal.SIGKILL)
        await watcher.state("ghost", "OFFLINE")
    await asyncio.sleep(6 * INTERVAL)  # the last heartbeat grows older than 3 intervals
    async with lively_coordinator(broker) as second:
        await _until(lambda: second.liveness.active)
        await asyncio.sleep(3 * INTERVAL)  # a few sweeps of the new judge
    states = [e.detail["state"] for e in watcher.states("ghost")]
    assert states.count("ONLINE") == 1, states


async def test_a_registered_agent_that_never_beats_has_its_tasks_taken_elsewhere(broker, watcher):
    """A card with no heartbeat (a process that died between registering and beating) is
    judged like a silent agent: its queued task is reassigned, not kept past its ttl."""
    phantom = AgentCard(agent_id="phantom", intents={"noop": Intent()})
    await put_value(broker, broker.names.agents_bucket, "phantom", msgspec.json.encode(phantom))
    config = lively(first_heartbeat_interval_s=INTERVAL)
    async with lively_coordinator(broker, config), ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("noop", {"n": 1})
        routed = await watcher.event("routed", message_id=message_id)
        async with local_agent("spare").running(broker=broker):
            await watcher.state("phantom", "OFFLINE")
            done = await watcher.event("completed", message_id=message_id)
    assert routed.agent_id == "phantom"
    assert [e.detail["state"] for e in watcher.states("phantom")] == ["SUSPECT", "OFFLINE"]
    assert done.agent_id == "spare" and done.attempt == 2


async def test_a_registration_request_that_cannot_be_granted_is_told_why(broker, coordinator):
    """A body naming another agent, or no request at all, gets an error instead of silence:
    an agent with that bug stops with it rather than retrying for ever."""
    names = broker.names
    wrong = msgspec.json.encode({"agent_id": "someone-else"})
    for body, why in ((wrong, "'someone-else'"), (b"{", "unreadable registration request")):
        answer = await broker.nc.request(names.register("asker"), body, timeout=5)
        reply = msgspec.json.decode(answer.data, type=RegisterReply)
        assert not reply.ok and reply.error is not None and why in reply.error


async def test_a_dead_agent_restarted_without_a_transition_has_its_tasks_moved(broker, watcher):
    """The verdict in KV names epoch 1, but the agent was restarted (epoch 2) without a
    transition, so none was written; then it died. A coordinator that starts now restored
    epoch 1, took its card's epoch 2 for a newer live process, and left its queued task
    there: the last heartbeat says which process was last, and the task moves on."""
    names = broker.names
    await (await broker.kv(names.liveness_bucket)).put(
        "swift",
        msgspec.json.encode(
            Liveness(agent_id="swift", state="ONLINE", since_ms=1, epoch=1, interval_s=INTERVAL)
        ),
    )
    card = AgentCard(agent_id="swift", intents={"noop": Intent()}, epoch=2, status="running")
    await put_value(broker, names.agents_bucket, "swift", msgspec.json.encode(card))
    beat = Heartbeat(agent_id="swift", epoch=2, seq=9, interval_s=INTERVAL)
    await put_value(broker, names.heartbeats_bucket, "swift", msgspec.json.encode(beat))
    task = Task(v=1, message_id="left-1", trace_id="left-1", topic="noop", to_agent="swift")
    await broker.publish(
        names.dispatch("swift", "P1"), msgspec.json.encode(task), headers=DISPATCHED
    )
    await asyncio.sleep(4 * INTERVAL)  # the last heartbeat grows older than 3 intervals
    async with lively_coordinator(broker), local_agent("spare").running(broker=broker):
        done = await watcher.event("completed", message_id="left-1", timeout=20)
    assert done.agent_id == "spare" and done.attempt == 2


async def test_a_stopping_agent_s_waiting_tasks_run_elsewhere_during_its_drain(
    broker, start_coordinator, watcher
):
    """An agent asked to stop finishes what it runs; the tasks waiting in its queue went to
    another agent only once its drain was over (here, never within the test). Its card now
    says draining: nothing more is routed to it, and its queue moves at once."""
    runs: list[tuple[str, str]] = []
    held, release = asyncio.Event(), asyncio.Event()
    stopping = Agent("drainer", startup_delay=0, drain_timeout=30)
    taker = Agent("taker", startup_delay=0)

    @stopping.handler("chore", capacity=1)
    async def slow_chore(ctx: TaskContext, payload: dict) -> dict:
        runs.append(("drainer", ctx.message_id))
        held.set()
        await release.wait()
        return payload

    @taker.handler("chore")
    async def chore(ctx: TaskContext, payload: dict) -> dict:
        runs.append(("taker", ctx.message_id))
        return payload

    async with (
        start_coordinator(LIVELY) as coordinator,
        ReachClient(broker=broker) as client,
        contextlib.AsyncExitStack() as drainer,
    ):
        await drainer.enter_async_context(stopping.running(broker=broker))
        await eventually(lambda: "drainer" in coordinator.directory.cards)
        first = asyncio.create_task(client.invoke("chore", {"n": 0}, message_id="drain-0"))
        await asyncio.wait_for(held.wait(), 10)
        waiting = [
            asyncio.create_task(client.invoke("chore", {"n": n}, message_id=f"drain-{n}"))
            for n in (1, 2)
        ]
        for n in (1, 2):  # queued behind the held one, in the drainer's queue
            await watcher.event("routed", message_id=f"drain-{n}")
        async with taker.running(broker=broker):
            await eventually(lambda: "taker" in coordinator.directory.cards)
            stop = asyncio.create_task(drainer.aclose())
            assert await asyncio.wait_for(asyncio.gather(*waiting), 10) == [{"n": 1}, {"n": 2}]
            assert not first.done() and not stop.done()
            release.set()
            assert await asyncio.wait_for(first, 10) == {"n": 0}
            await asyncio.wait_for(stop, 10)
    assert sorted(runs) == [("drainer", "drain-0"), ("taker", "drain-1"), ("taker", "drain-2")]
    moved = [e for e in watcher.events if e.event == "retry_scheduled"]
    assert {e.message_id for e in moved} == {"drain-1", "drain-2"}
    assert all(e.detail["error"]["message"] == "drainer began to stop before it ran" for e in moved)


async def test_an_agent_asking_for_slots_in_a_loop_leaves_the_others_theirs(broker):
    """Registration slots are few a second per replica, shared by every agent: one agent
    asking in a loop took each as it came, and every other agent waited. One agent id gets a
    slot a second at most."""
    config = lively(registration_rate=5.0, registration_burst=5)
    names = broker.names

    async def ask(agent_id: str) -> RegisterReply:
        body = msgspec.json.encode(RegisterRequest(agent_id=agent_id))
        answer = await broker.nc.request(names.register(agent_id), body, timeout=5)
        return msgspec.json.decode(answer.data, type=RegisterReply)

    async with lively_coordinator(broker, config):
        flood = [await ask("greedy-1") for _ in range(20)]
        newcomers = [await ask(f"newcomer-{i}") for i in range(4)]
    assert [reply.ok for reply in flood] == [True] + [False] * 19
    assert all(0 < reply.retry_after_ms <= 1001 for reply in flood[1:])
    assert all(reply.ok for reply in newcomers)
