"""Presence checks between heartbeats, through a real server: a killed agent holding work is
found in a moment, not after the silence thresholds; a live one reconnecting is not."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, EmbeddedServer, Names, Topology, provision
from agentreach.coordinator import Coordinator, CoordinatorConfig, DeliveryConfig, LivenessConfig
from agentreach.coordinator.liveness.presence_checks import NO_CONNECTION, PresenceChecks
from agentreach.coordinator.liveness.tracked import Tracked
from agentreach.envelopes import AgentCard, Liveness, LivenessState
from tests.cli.conftest import reach_argv
from tests.support import Watcher, eventually, wait_for_card

REPO = Path(__file__).parents[3]
# Heartbeats this far apart put the silence thresholds at 3 and 5 intervals (6 s and 10 s):
# what is found sooner was found by a presence check.
INTERVAL = 2.0
CHECKING = CoordinatorConfig(
    liveness=LivenessConfig(
        tick_s=0.05,
        probe_connection_s=0.3,
        probe_ping_s=0.3,
        probe_retry_s=0.3,
        presence_check_s=0.1,
    ),
    delivery=DeliveryConfig(base_s=0.05, cap_s=0.2),
    lease_ttl_s=0.6,
)


def checking(**liveness: object) -> CoordinatorConfig:
    """CHECKING with some of its liveness settings changed."""
    changed = msgspec.structs.replace(CHECKING.liveness, **liveness)
    return msgspec.structs.replace(CHECKING, liveness=changed)


@contextlib.asynccontextmanager
async def napper_process(
    broker: Broker, agent_id: str, interval_s: float = INTERVAL
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`reach agent tests.coordinator.liveness.napper:agent` as its own process, serving
    until the block ends (or it is killed)."""
    env = {**os.environ, "NAPPER_ID": agent_id, "NAPPER_INTERVAL": str(interval_s)}
    process = await asyncio.create_subprocess_exec(
        *reach_argv(broker, "agent", "tests.coordinator.liveness.napper:agent"),
        cwd=REPO,
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_for_card(broker, agent_id, status="running")
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()


def holding_agent(agent_id: str, release: asyncio.Event, interval_s: float = INTERVAL) -> Agent:
    """An agent whose ``hold`` tasks run until ``release`` is set; ``nap`` ones end at once."""
    agent = Agent(agent_id, startup_delay=0, heartbeat_interval=interval_s)

    @agent.handler("hold", deadline_ms=120_000)
    async def hold(ctx: TaskContext, payload: object) -> object:
        await release.wait()
        return {"held": True}

    @agent.handler("nap")
    async def nap(ctx: TaskContext, payload: object) -> object:
        return {"by": agent_id}

    return agent


def answered(coordinator: Coordinator, agent_id: str) -> bool:
    """Whether a presence check of the agent's current process has been answered."""
    tracked = coordinator.liveness.agents.get(agent_id)
    return tracked is not None and tracked.answered_epoch == tracked.epoch > 0


def states(watcher: Watcher, agent_id: str) -> list[tuple[str, str]]:
    return [(e.detail["state"], e.detail["reason"]) for e in watcher.states(agent_id)]


async def test_an_agent_killed_mid_task_is_offline_at_once_and_its_task_done_elsewhere(
    broker, start_coordinator, watcher
):
    """kill -9 of an agent holding a task: a presence check finds its connection gone, it is
    OFFLINE ("connection gone") and its task completed by another agent before the silence
    thresholds could even have suspected it."""
    async with (
        start_coordinator(CHECKING) as coordinator,
        napper_process(broker, "doomed") as process,
        ReachClient(broker=broker) as client,
    ):
        await watcher.state("doomed", "ONLINE")
        message_id, _ = await client.publish("nap", {"seconds": 120})
        accepted = await watcher.event("accepted", message_id=message_id)
        await eventually(lambda: answered(coordinator, "doomed"))
        async with holding_agent("spare", asyncio.Event()).running(broker=broker):
            process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            offline = await watcher.state("doomed", "OFFLINE")
            done = await watcher.event("completed", message_id=message_id)
            took = time.monotonic() - killed
    assert accepted.agent_id == "doomed"
    assert offline.detail["reason"] == "connection gone"
    assert states(watcher, "doomed") == [
        ("ONLINE", "heartbeat"),
        ("SUSPECT", "no connection"),
        ("OFFLINE", "connection gone"),
    ]
    assert (done.agent_id, done.attempt) == ("spare", 2)
    # Its last heartbeat was at most 1.2 intervals before the kill: silence could not make it
    # SUSPECT (3 intervals) sooner than 1.8 intervals after the kill, let alone OFFLINE.
    assert took < 1.8 * INTERVAL, took


async def test_a_busy_agent_away_for_less_than_a_reconnect_is_suspected_not_offline(
    broker, start_coordinator, watcher
):
    """A busy agent's connection away for a moment (what the server sees of a client that is
    reconnecting): SUSPECT "no connection" at once, so it gets no new work; ONLINE again
    ("connection back") when it answers within ``probe_retry_s``; never OFFLINE, and its
    task is finished by itself, once."""
    release = asyncio.Event()
    async with (
        start_coordinator(checking(probe_retry_s=2.0)) as coordinator,
        holding_agent("blinking", release).running(broker=broker) as runtime,
        ReachClient(broker=broker) as client,
    ):
        await watcher.state("blinking", "ONLINE")
        message_id, _ = await client.publish("hold", {})
        await watcher.event("accepted", message_id=message_id)
        await eventually(lambda: answered(coordinator, "blinking"))
        assert runtime.heartbeats is not None and runtime._presence is not None
        runtime._duties[0].cancel()  # no heartbeats and no subscription: reconnecting
        await runtime._presence.stop()
        suspect = await watcher.state("blinking", "SUSPECT")
        await runtime._presence.start()
        back = await watcher.state("blinking", "ONLINE", after=suspect)
        runtime._duties[0] = asyncio.create_task(runtime.heartbeats.run())
        release.set()
        done = await watcher.event("completed", message_id=message_id)
        judged = states(watcher, "blinking")  # before it stops (OFFLINE, "stopped")
    assert suspect.detail["reason"] == "no connection"
    assert back.detail["reason"] == "connection back"
    assert "OFFLINE" not in [state for state, _ in judged]
    assert (done.agent_id, done.attempt) == ("blinking", 1)
    assert watcher.count("retry_scheduled", {message_id}) == 0


def _port() -> int:
    """A free port of the range these tests may use for a server they restart."""
    for port in range(14200, 14300):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return port
    raise RuntimeError("no free port in 14200-14299")


async def test_a_server_restart_makes_no_live_agent_offline_and_a_dead_one_is_still_found(
    tmp_path,
):
    """nats-server killed and restarted while two agents hold tasks: every client is away
    until it reconnects, and the live agent is never judged for it; the other one, killed
    after the restart, is found by its presence check and its task completed elsewhere."""
    # A client reconnects within a second of a quick restart; on a loaded machine (CI runs two
    # suites at once) it took over 3 s, and a live agent was SUSPECT for a moment.
    config = checking(probe_retry_s=6.0)
    release, names = asyncio.Event(), Names()
    async with (
        EmbeddedServer(port=_port(), store_dir=tmp_path / "nats") as server,
        Broker(server.url, names=names, name="test") as broker,
    ):
        await provision(broker, Topology.default(names))
        async with (
            Watcher(broker) as watcher,
            Broker(server.url, names=names, name="coordinator") as own,
            Coordinator(own, config).running() as coordinator,
            napper_process(broker, "doomed", interval_s=5.0) as process,
            ReachClient(broker=broker) as client,
        ):
            napping, _ = await client.publish("nap", {"seconds": 120})
            await watcher.event("accepted", message_id=napping)  # only "doomed" naps so far
            async with holding_agent("steady", release, interval_s=5.0).running(broker=broker):
                holding, _ = await client.publish("hold", {})
                await watcher.event("accepted", message_id=holding)
                await eventually(lambda: answered(coordinator, "doomed"))
                await eventually(lambda: answered(coordinator, "steady"))
                await server.kill()
                await server.restart()
                process.send_signal(signal.SIGKILL)
                offline = await watcher.state("doomed", "OFFLINE", timeout=20)
                moved = await watcher.event("completed", message_id=napping)
                release.set()
                held = await watcher.event("completed", message_id=holding)
                judged = states(watcher, "steady")  # before it stops (OFFLINE, "stopped")
    assert states(watcher, "doomed") == [
        ("ONLINE", "heartbeat"),
        ("SUSPECT", "no connection"),  # not "missed heartbeats": silence was not waited out
        ("OFFLINE", "connection gone"),
    ]
    assert offline.detail["reason"] == "connection gone"
    assert judged == [("ONLINE", "heartbeat")]
    assert (moved.agent_id, moved.attempt) == ("steady", 2)
    assert (held.agent_id, held.attempt) == ("steady", 1)


class _Judged:
    """Records the transitions a check asks for, and makes them."""

    def __init__(self) -> None:
        self.said: list[tuple[str, LivenessState, str]] = []

    async def judge(self, tracked: Tracked, state: LivenessState, reason: str) -> None:
        tracked.state, tracked.reason = state, reason
        self.said.append((tracked.agent_id, state, reason))

    async def look_again(self, overdue: list[Tracked]) -> None:
        pass  # no heartbeat in the bucket to find


def _checks(broker: Broker, agents: dict[str, Tracked], judged: _Judged, **config: object):
    liveness = msgspec.structs.replace(CHECKING.liveness, **config)
    return PresenceChecks(
        broker, liveness, agents, None, judge=judged.judge, look_again=judged.look_again
    )


async def test_an_agent_that_never_answered_and_beats_on_time_is_not_suspected(broker):
    """No presence subscription ("no responders") from a busy agent whose heartbeat is on
    time and that never answered a check: nothing is judged (an agent without presence,
    against the protocol, must not be found gone while it beats); the same answer from one
    that answered before makes it SUSPECT, then OFFLINE when it is still the answer."""
    judged = _Judged()
    busy = Tracked("busy-1", 60.0, time.monotonic(), state="ONLINE", epoch=1, in_flight=1)
    checks = _checks(broker, {"busy-1": busy}, judged)
    await checks._check(busy)
    assert judged.said == [] and busy.state == "ONLINE"
    busy.answered_epoch = 1  # this process answered an earlier check
    await checks._check(busy)
    assert judged.said == [
        ("busy-1", "SUSPECT", "no connection"),
        ("busy-1", "OFFLINE", "connection gone"),
    ]


async def test_a_heartbeat_during_the_reconnect_window_ends_the_suspicion(broker):
    """A heartbeat that arrives while a "no responders" waits to be confirmed: no OFFLINE."""
    judged = _Judged()
    busy = Tracked("busy-2", 60.0, time.monotonic(), state="ONLINE", epoch=1, in_flight=1)
    busy.answered_epoch = 1
    checks = _checks(broker, {"busy-2": busy}, judged, probe_retry_s=1.0)
    check = asyncio.create_task(checks._check(busy))
    await eventually(lambda: busy.state == "SUSPECT")
    busy.last_seen, busy.state = time.monotonic(), "ONLINE"  # what a heartbeat does
    await check
    assert judged.said == [("busy-2", "SUSPECT", "no connection")]


async def test_a_suspicion_a_check_left_unsettled_is_settled_by_the_next(broker):
    """An agent a check made SUSPECT without settling it (no answer in time, or an outage
    meanwhile) is OFFLINE at the next check that finds no connection twice, the reconnect
    window apart."""
    judged = _Judged()
    gone = Tracked("gone-1", 60.0, time.monotonic(), state="SUSPECT", epoch=1, in_flight=1)
    gone.reason, gone.answered_epoch = NO_CONNECTION, 1
    await _checks(broker, {"gone-1": gone}, judged)._check(gone)
    assert judged.said == [("gone-1", "OFFLINE", "connection gone")]


async def test_checks_per_tick_are_bounded_and_go_to_the_agents_at_risk(broker):
    """Each tick checks at most ``presence_checks_per_tick`` agents: those holding work (in
    flight, or queued for them), late with their heartbeat, or suspected by a check and not
    settled yet, the longest without a sign of life first; idle agents on time, agents judged
    otherwise, and agents checked a moment ago are left alone."""
    now = time.monotonic()

    def agent(agent_id: str, silent_s: float, **fields: object) -> Tracked:
        fields = {"state": "ONLINE", **fields}
        return Tracked(agent_id, 10.0, now - silent_s, epoch=1, **fields)  # type: ignore[arg-type]

    fleet = [
        agent("busy-old", 9.0, in_flight=2),
        agent("busy-new", 3.0, in_flight=1),
        agent("busy-fresh", 0.5, in_flight=1),  # a heartbeat half a second ago
        agent("busy-checked", 9.0, in_flight=1, checked_at=now - 0.5),
        agent("queued", 8.0),
        agent("late", 16.0),
        agent("idle", 9.0),
        agent("suspected", 5.0, state="SUSPECT", reason=NO_CONNECTION),  # by a check
        agent("suspect", 25.0, in_flight=1, state="SUSPECT", reason="missed heartbeats"),
        agent("offline", 99.0, in_flight=1, state="OFFLINE", reason="connection gone"),
    ]
    agents = {tracked.agent_id: tracked for tracked in fleet}
    checks = PresenceChecks(
        broker,
        msgspec.structs.replace(CHECKING.liveness, presence_check_s=1.0),
        agents,
        lambda: {("queued", "P1")},
        judge=_Judged().judge,
        look_again=_Judged().look_again,
    )
    everyone = [t.agent_id for t in checks.due()]
    assert everyone == ["late", "busy-old", "queued", "suspected", "busy-new"]
    limited = _checks(broker, agents, _Judged(), presence_check_s=1.0, presence_checks_per_tick=2)
    assert [t.agent_id for t in limited.due()] == ["late", "busy-old"]


async def test_a_replica_taking_the_judging_over_knows_which_agents_answer_checks(broker):
    """The replica judging liveness died with an agent: the one that took over had never
    heard that agent answer a check, so its "no responders" did not count, and the agent was
    OFFLINE after 40 s, not 10 (a cluster walkthrough). An agent's first answer of a process
    is kept in its verdict, once, and a replica restoring the verdicts counts it."""
    from agentreach.coordinator.liveness.monitor import LivenessMonitor

    release = asyncio.Event()
    agent = holding_agent("answerer-1", release)
    judged, remembered = _Judged(), []
    async with agent.running(broker=broker):
        await wait_for_card(broker, "answerer-1", status="running")
        epoch = (await _card(broker, "answerer-1")).epoch
        busy = Tracked("answerer-1", 60.0, time.monotonic(), state="ONLINE", epoch=epoch)
        liveness = CHECKING.liveness
        checks = PresenceChecks(
            broker, liveness, {"answerer-1": busy}, None, judge=judged.judge,
            look_again=judged.look_again, answered=remembered.append,
        )  # fmt: skip
        for _ in range(2):
            await checks._check(busy)
    assert remembered == [busy] and busy.record().answered_epoch == epoch
    verdicts = await broker.bucket(broker.names.liveness_bucket, Liveness)
    await verdicts.put("answerer-1", busy.record())
    taking_over = LivenessMonitor(broker, liveness)
    await taking_over._restore()
    assert taking_over.agents["answerer-1"].answered_epoch == epoch


async def _card(broker: Broker, agent_id: str) -> AgentCard:
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    entry = await cards.get(agent_id)
    assert entry is not None
    return entry.value
