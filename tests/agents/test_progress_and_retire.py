"""Progress that keeps a handler alive, its events each recorded, and a stop that leaves a
newer process's registration alone."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, EmbeddedServer, Topology, provision
from agentreach.broker.embedded import PID_FILE
from agentreach.broker.lifecycle import trace_of
from agentreach.envelopes import AgentCard, Budget, Execution, Heartbeat, execution_key
from tests.support import Watcher, eventually, stopped, until_true


async def test_every_progress_report_is_recorded_even_within_one_millisecond(
    broker, coordinator, watcher
):
    """Back-to-back progress reports each get their own event: none is dropped as a
    duplicate of another made in the same millisecond."""
    agent = Agent("chatty-1", startup_delay=0)

    @agent.handler("chatter")
    async def chatter(ctx: TaskContext, payload: dict) -> dict:
        for n in range(5):
            await ctx.progress(f"step {n}")
        return {}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("chatter", {})
        await watcher.event("completed", message_id=message_id)
    stored = [e for e in await trace_of(broker, message_id) if e.event == "progress"]
    assert [e.detail["note"] for e in stored] == [f"step {n}" for n in range(5)]
    assert len({e.at_ms for e in stored}) == 5


async def test_progress_a_run_reports_after_its_end_is_not_made(broker, coordinator, watcher):
    """A handler that leaves a task reporting progress after it returned (its run ended):
    the report is not made, and the trace ends with `completed`, not a `progress` after it."""
    agent = Agent("lingering-1", startup_delay=0)
    ended, reported_late = asyncio.Event(), asyncio.Event()

    @agent.handler("linger")
    async def linger(ctx: TaskContext, payload: dict) -> dict:
        async def later() -> None:
            await ended.wait()
            await ctx.progress("after the end")
            reported_late.set()

        asyncio.get_running_loop().create_task(later())
        await ctx.progress("during the run")
        return {}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("linger", {})
        await watcher.event("completed", message_id=message_id)
        ended.set()
        await asyncio.wait_for(reported_late.wait(), 10)
        await client.publish(
            "linger", {}, message_id="linger-barrier"
        )  # a later event, stored after it
        await watcher.event("completed", message_id="linger-barrier")
    notes = [e.detail.get("note") for e in await trace_of(broker, message_id)]
    assert "during the run" in notes and "after the end" not in notes


async def test_progress_gives_the_handler_its_deadline_again_and_extends_the_claim(
    broker, coordinator
):
    """A handler with deadline_ms 300 that reports progress every 150 ms runs past 300 ms,
    and each report moves its claim's lease on."""
    agent = Agent("patient-1", startup_delay=0)
    executions = await broker.bucket(broker.names.executions_bucket, Execution)
    leases: list[int] = []

    @agent.handler("marathon", deadline_ms=300)
    async def marathon(ctx: TaskContext, payload: dict) -> dict:
        for _ in range(5):
            await asyncio.sleep(0.15)
            await ctx.progress("still going")
            key = execution_key(ctx.envelope.caller, ctx.message_id, ctx.agent_id)
            record = await executions.get(key)
            assert record is not None
            leases.append(record.value.lease_until_ms)
        return {"deadline_ms": ctx.deadline_ms}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("marathon", {})
    assert result["deadline_ms"] > 600
    assert leases == sorted(leases) and leases[0] < leases[-1]


async def test_progress_never_extends_past_the_execute_budget(broker, coordinator, watcher):
    """However often it reports progress, a handler stops at the sender's execute budget."""
    agent = Agent("eager-1", startup_delay=0)

    @agent.handler("endless", deadline_ms=200, max_attempts=1)
    async def endless(ctx: TaskContext, payload: dict) -> dict:
        while True:
            await asyncio.sleep(0.05)
            await ctx.progress("more")

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        message_id, _ = await client.publish("endless", {}, budget=Budget(execute_ms=600))
        failed = await watcher.event("failed", message_id=message_id)
    assert failed.detail["error"]["type"] == "deadline_exceeded"
    # 600 unless a starved loop let one 200 ms window lapse between two reports first
    ran_past = re.fullmatch(r"handler ran past (\d+) ms", failed.detail["error"]["message"])
    assert ran_past is not None and 200 <= int(ran_past.group(1)) <= 600


async def test_a_server_away_during_a_progress_report_costs_the_handler_nothing(
    broker, coordinator, tmp_path
):
    """The server stops answering (SIGSTOP, a second) while a handler with deadline_ms 400
    reports progress: the report waits for it, the deadline does not pass meanwhile, and
    the task completes in its first attempt (it used to fail it as deadline_exceeded)."""
    pid_file = tmp_path / "nats" / PID_FILE
    if not pid_file.exists():
        pytest.skip("stops the test's own nats-server (NATS_URL is set)")
    pid = int(pid_file.read_text())
    agent = Agent("reporter-1", startup_delay=0)
    attempts: list[int] = []

    @agent.handler("steps", deadline_ms=400)
    async def steps(ctx: TaskContext, payload: dict) -> dict:
        attempts.append(ctx.attempt)
        for step in range(3):
            await asyncio.sleep(0.1)
            if step == 1:
                await stopped(pid)
                asyncio.get_running_loop().call_later(1.0, os.kill, pid, signal.SIGCONT)
            await ctx.progress(f"step {step}")
        return {"steps": 3}

    try:
        async with agent.running(broker=broker), ReachClient(broker=broker) as client:
            assert await client.invoke("steps", {}) == {"steps": 3}
    finally:
        os.kill(pid, signal.SIGCONT)
    assert attempts == [1]


async def test_stop_leaves_the_card_and_heartbeat_of_a_newer_process(broker):
    """A process that stops after a newer one registered the same id (it was cut off, and
    replaced) neither marks the newer card stopped nor deletes the newer heartbeat."""
    agent = Agent("replaced-1", startup_delay=0, heartbeat_interval=30)
    agent.handler("noop")(lambda ctx, payload: None)
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    beats = await broker.bucket(broker.names.heartbeats_bucket, Heartbeat)
    async with agent.running(broker=broker) as runtime:
        assert runtime.card is not None
        # its first beat is written once it runs: the newer process's must come after it
        await until_true(lambda: _has_beat(beats, agent.agent_id))
        newer = msgspec.structs.replace(runtime.card, epoch=runtime.card.epoch + 1, pid=1)
        await cards.put(agent.agent_id, newer)
        beat = Heartbeat(agent_id=agent.agent_id, epoch=newer.epoch, seq=1, interval_s=30)
        await beats.put(agent.agent_id, beat)
    card = await cards.get(agent.agent_id)
    heartbeat = await beats.get(agent.agent_id)
    assert card is not None and (card.value.status, card.value.epoch) == ("running", newer.epoch)
    assert heartbeat is not None and heartbeat.value.epoch == newer.epoch


async def _has_beat(beats, agent_id: str) -> bool:  # type: ignore[no-untyped-def]
    return await beats.get(agent_id) is not None


async def test_stop_marks_its_own_card_stopped_and_deletes_its_heartbeat(broker):
    """The usual stop: this process's card becomes stopped and its heartbeat goes."""
    agent = Agent("retiring-1", startup_delay=0)
    agent.handler("noop")(lambda ctx, payload: None)
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    beats = await broker.bucket(broker.names.heartbeats_bucket, Heartbeat)
    async with agent.running(broker=broker):
        pass
    card = await cards.get(agent.agent_id)
    assert card is not None and card.value.status == "stopped"
    assert await beats.get(agent.agent_id) is None


async def test_a_stop_while_the_server_is_away_waits_a_second_for_it_not_each_write(tmp_path):
    """Stopped while its server is away (a SIGTERM during an outage), an agent's last writes
    (the card stopped, the heartbeat deleted) each waited 5 s for the connection: the stop
    took 7 s (an outside trial). It now waits a second for the connection, then stops and
    says why."""
    agent = Agent("away-1", startup_delay=0)
    agent.handler("noop")(lambda ctx, payload: None)
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "nats") as server:
        async with Broker(server.url, name="provisioner") as own:
            await provision(own, Topology.default(own.names))
        async with agent.running(server.url) as runtime:
            await server.stop()
            with capture_logs() as logs:
                async with asyncio.timeout(4):  # 7 s before
                    await runtime.stop()
    said = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert any(line.startswith("NATS is unreachable: stopping without marking") for line in said)


async def test_a_handler_longer_than_the_ack_wait_is_not_redelivered(broker, coordinator):
    """A handler that runs past the consumer's ack wait without reporting progress keeps its
    message: it is not delivered again meanwhile (one ack, one run)."""
    agent = Agent("steady-1", startup_delay=0, ack_wait=1.0)
    runs: list[int] = []

    @agent.handler("long_haul")
    async def long_haul(ctx: TaskContext, payload: dict) -> dict:
        runs.append(ctx.attempt)
        await asyncio.sleep(2.5)  # the length of the work is what this test is about
        return {}

    acks: list[object] = []
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        await client.invoke("long_haul", {}, on_ack=acks.append)
    assert len(acks) == 1
    assert runs == [1]


async def test_a_delivery_whose_lease_ran_out_while_claiming_keeps_the_run_from_its_redelivery(
    broker, coordinator, monkeypatch
):
    """Claiming can wait out a leader election longer than the claim's lease; the
    redelivery that comes meanwhile to this same process waits for the delivery that holds
    the claim (it once took the lapsed claim over, and a run that went on ran twice), and
    answers from its record. The stalled delivery renews its lease and runs it, once (a
    stall injected after the first claim stands in for the election)."""
    from agentreach.agents.claims import Claims
    from agentreach.agents.execution import Executor

    runs: list[int] = []
    verdicts: list[bool] = []
    stalled = asyncio.Event()
    claim, lease_holds = Claims.claim_when_free, Executor._lease_holds

    async def claim_slowly(self: Claims, *args, **options):  # type: ignore[no-untyped-def]
        taken = await claim(self, *args, **options)
        if not stalled.is_set():
            stalled.set()
            await asyncio.sleep(2.0)  # past the lease (300 + 1,000 ms) and the ack wait
        return taken

    async def judged(self: Executor, *args) -> bool:
        verdict = await lease_holds(self, *args)
        verdicts.append(verdict)
        return verdict

    monkeypatch.setattr(Claims, "claim_when_free", claim_slowly)
    monkeypatch.setattr(Executor, "_lease_holds", judged)
    agent = Agent("stalled-1", startup_delay=0, ack_wait=0.5)

    @agent.handler("once", deadline_ms=300)
    async def once(ctx: TaskContext, payload: dict) -> dict:
        runs.append(ctx.attempt)
        return {"runs": len(runs)}

    async with (
        agent.running(broker=broker),
        ReachClient(broker=broker) as client,
        Watcher(broker) as watcher,
    ):
        with capture_logs() as logs:
            message_id, _ = await client.publish("once", {})
            await watcher.event("completed", message_id=message_id)
            redelivered = "another delivery holds this message"
            await eventually(lambda: any(e["event"] == redelivered for e in logs))
            await watcher.until(
                lambda: len([e for e in watcher.events if e.event == "completed"]) >= 2 or None,
                "the redelivery answered from the record",
            )
    assert runs == [1] and verdicts == [True]


async def test_a_heartbeat_of_a_newer_epoch_over_its_own_stops_the_agent(broker):
    """Protocol §7: the conditional heartbeat write is refused (another process wrote one
    since), the agent reads the heartbeat, sees a higher epoch and stops. On a secured
    server its creds must let it read its own heartbeat: they did not (the read was a
    permissions violation, logged as a heartbeat not written, and the agent went on)."""
    agent = Agent("fenced-1", startup_delay=0, heartbeat_interval=0.2)

    @agent.handler("fenced")
    async def fenced(ctx: TaskContext, payload: dict) -> dict:
        return {}

    beats = await broker.bucket(broker.names.heartbeats_bucket, Heartbeat)
    async with agent.running(broker=broker) as runtime:
        await until_true(lambda: beats.get("fenced-1"))
        newer = Heartbeat(agent_id="fenced-1", epoch=99, seq=1, interval_s=15.0)
        await beats.put("fenced-1", newer)
        await asyncio.wait_for(runtime.replaced.wait(), 10)
    assert runtime.replaced_by_epoch == 99
    assert (await beats.get("fenced-1")).value.epoch == 99  # not written over


async def test_a_heartbeat_naming_another_agent_on_its_key_is_written_over(broker):
    """A value on the agent's key that names another agent (written with the agent's own
    creds: an outside trial's liar) is no newer process of this id: the agent writes its
    beat over it and serves on, as the coordinator ignores it."""
    agent = Agent("fenced-2", startup_delay=0, heartbeat_interval=0.2)

    @agent.handler("fenced")
    async def fenced(ctx: TaskContext, payload: dict) -> dict:
        return {}

    beats = await broker.bucket(broker.names.heartbeats_bucket, Heartbeat)
    async with agent.running(broker=broker) as runtime:
        await until_true(lambda: beats.get("fenced-2"))
        with capture_logs() as logs:
            forged = Heartbeat(agent_id="someone-else", epoch=99, seq=1, interval_s=15.0)
            await beats.put("fenced-2", forged)

            async def own_again() -> bool:
                entry = await beats.get("fenced-2")
                return entry is not None and entry.value.agent_id == "fenced-2"

            await until_true(own_again)
        assert not runtime.replaced.is_set()
    said = [line for line in logs if "names another agent" in line["event"]]
    assert said and said[0]["named"] == "someone-else"


async def test_a_control_interval_over_300_s_is_ignored(broker):
    """The coordinator ignores beats of an interval over 300 s (protocol §7): an agent that
    took one from a control message (no coordinator sends it) would look silent."""
    agent = Agent("ctl-300", startup_delay=0, heartbeat_interval=1.0)

    @agent.handler("ctl")
    async def ctl(ctx: TaskContext, payload: dict) -> dict:
        return {}

    async with agent.running(broker=broker) as runtime:
        # Its first beat is written once it listens for control messages.
        await eventually(lambda: runtime.heartbeats and runtime.heartbeats.revision)
        with capture_logs() as logs:
            subject = broker.names.agent_control("ctl-300")
            control = {"Reach-Kind": "control"}  # as the coordinator sends it
            await broker.publish_core(subject, b'{"heartbeat_interval_s": 3600}', headers=control)
            said = "ignoring a heartbeat interval over 300 s"
            await eventually(lambda: any(e["event"] == said for e in logs))
            await broker.publish_core(subject, b'{"heartbeat_interval_s": 2.5}', headers=control)
            await eventually(lambda: runtime.heartbeats.interval_s == 2.5)
    assert not any(e.get("interval_s") == 3600 and e["event"] != said for e in logs)


async def test_a_control_message_without_headers_is_ignored(broker):
    """An agent had the server copy a control message of its own with no headers (a direct
    get's `no_hdr`) to another agent's control subject: it beat every 0.5 s, or could be
    told to beat every 300 s and look dead (a security re-test). The coordinator's carry a
    header; one without is nobody's."""
    agent = Agent("ctl-bare", startup_delay=0, heartbeat_interval=1.0)

    @agent.handler("ctl")
    async def ctl(ctx: TaskContext, payload: dict) -> dict:
        return {}

    async with agent.running(broker=broker) as runtime:
        await eventually(lambda: runtime.heartbeats and runtime.heartbeats.revision)
        with capture_logs() as logs:
            subject = broker.names.agent_control("ctl-bare")
            await broker.publish_core(subject, b'{"heartbeat_interval_s": 0.5}')
            said = "ignoring a control message without headers"
            await eventually(lambda: any(e["event"] == said for e in logs))
            # Headers, but not the coordinator's (a review): ignored too.
            other = {"Nats-Msg-Id": "x"}
            await broker.publish_core(subject, b'{"heartbeat_interval_s": 0.5}', headers=other)
            said = "ignoring a control message without the header Reach-Kind: control"
            await eventually(lambda: any(e["event"] == said for e in logs))
    assert runtime.heartbeats.interval_s == 1.0
