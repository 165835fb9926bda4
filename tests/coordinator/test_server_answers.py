"""The NATS server's answers that a party aimed at our subjects: nats-server sends its answer
to a request (a JetStream API response, a publish acknowledgement, a pull's status) to the
reply subject the request named, checked against no permission, so any party could have the
server write onto a subject it may not publish to itself. Such a message is nobody's."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker
from agentreach.broker.lifecycle import event_for
from agentreach.broker.names import COORDINATOR
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.protection.server_answers import ServerAnswers
from agentreach.coordinator.workflows import read_record
from agentreach.envelopes import (
    AgentCard,
    Event,
    Execution,
    LeaseRecord,
    Result,
    Task,
    decode_as,
    encode,
    now_ms,
    server_answer,
)
from agentreach.envelopes.coordination import step_message_id
from tests.coordinator.workflows.test_cancel import HELD, secured
from tests.e2e.routing_support import fast, serving
from tests.secured import SecuredDeployment, sealed_deployment
from tests.support import Watcher, eventually, until_true

INJECTED = "not a message of anyone's: a NATS server's API response"


async def test_a_server_answer_aimed_at_a_cancel_or_another_caller_s_intake_is_nobody_s(
    tmp_path: Path,
) -> None:
    """A caller, bob, aimed `$JS.API.STREAM.NAMES` at the operators' cancel subject of
    alice's instance and at alice's intake: the instance was cancelled (a walkthrough), and a
    task ran in alice's name on her quota. Now each is a dead letter saying what it is; the
    instance runs on, and no task is alice's."""
    async with (
        secured(tmp_path) as arena,
        ReachClient(arena.url, name="alice", auth=arena.caller("alice")) as alice,
        Broker(arena.url, name="bob", auth=arena.caller("bob")) as bob,
        Watcher(arena.admin) as watcher,
    ):
        instance = f"flow-{uuid.uuid4().hex[:8]}"
        invoked = asyncio.create_task(alice.invoke(HELD, {"n": 1}, message_id=instance))
        assert await asyncio.wait_for(arena.held.get(), 10) == {"n": 1}
        names = bob.names
        for target in (names.workflow_cancel(instance), names.task("hold-step", "alice")):
            await bob.nc.publish("$JS.API.STREAM.NAMES", b"", reply=target)
        letters = [
            await watcher.dead_letter("invalid_envelope", topic=topic)
            for topic in ("_workflow", "hold-step")
        ]
        with capture_logs() as logs:  # within the minute: dropped, not lettered
            for _ in range(3):
                target = names.task("hold-step", "alice")
                await bob.nc.publish("$JS.API.STREAM.NAMES", b"", reply=target)
            await eventually(lambda: sum("dropped" in e["event"] for e in logs) == 3)
        injected = [x for x in watcher.dead_letters if x.error and INJECTED in x.error.message]
        record = await read_record(arena.admin, instance)
        arena.release.set()
        assert await asyncio.wait_for(invoked, 10) == {"held": {"n": 1}}
    assert record is not None and record.status == "running"
    for letter in letters:
        assert letter.error is not None and letter.error.message.startswith(INJECTED), letter
    intake_letter = letters[1]
    assert intake_letter.envelope is None and "alice" not in json.dumps(intake_letter.trace)
    assert not [e for e in watcher.events if e.event == "routed" and e.topic == "hold-step"][1:]
    assert len(injected) == 2  # one a minute each, of the intake's and the workflows'


async def test_an_empty_pull_status_aimed_at_a_cancel_is_nobody_s(tmp_path: Path) -> None:
    """An agent's empty pull of its own consumer, its reply aimed at the operators' cancel:
    the server's 404 status is kept by the stream as an empty message without headers, and
    it cancelled another caller's workflow (a re-test of the fix)."""
    async with (
        secured(tmp_path) as arena,
        ReachClient(arena.url, name="alice", auth=arena.caller("alice")) as alice,
        Broker(arena.url, name="holder", auth=arena.deployment.auth("agent", "holder")) as agent,
        Watcher(arena.admin) as watcher,
    ):
        instance = f"flow-{uuid.uuid4().hex[:8]}"
        invoked = asyncio.create_task(alice.invoke(HELD, {"n": 1}, message_id=instance))
        assert await asyncio.wait_for(arena.held.get(), 10) == {"n": 1}
        pull = f"$JS.API.CONSUMER.MSG.NEXT.{agent.names.dispatch_streams['P2']}.agent-holder-p2"
        cancel = agent.names.workflow_cancel(instance)
        await agent.nc.publish(pull, b'{"batch": 1, "no_wait": true}', reply=cancel)
        letter = await watcher.dead_letter("invalid_envelope", topic="_workflow")
        record = await read_record(arena.admin, instance)
        arena.release.set()
        assert await asyncio.wait_for(invoked, 10) == {"held": {"n": 1}}
    assert record is not None and record.status == "running"
    assert letter.error is not None
    assert "an empty message without headers" in letter.error.message


async def test_a_direct_get_answer_of_content_a_party_chose_is_nobody_s(
    broker, coordinator, watcher
) -> None:
    """An agent wrote what it liked under a key of its own, then direct-got it with the reply
    aimed at another caller's intake: a task ran in alice's name (a security re-test). The
    server's answer keeps the stored message's headers, which say what it is."""
    names = broker.names
    own = f"$KV.{names.executions_bucket}.x.t.holder"
    direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
    await broker.publish(own, b'{"text": "forged as alice"}')
    await broker.nc.publish(direct, b"", reply=names.task("hold-step", "alice"))
    letter = await watcher.dead_letter("invalid_envelope", topic="hold-step")
    assert letter.error is not None and "a JetStream direct get's answer" in letter.error.message
    assert not [e for e in watcher.events if e.event == "routed"]


def test_what_the_server_writes_is_told_from_what_parties_send() -> None:
    api = b'{"type":"io.nats.jetstream.api.v1.stream_names_response","total":2,"streams":[]}'
    assert server_answer(api, None) == (
        "a NATS server's API response (io.nats.jetstream.api.v1.stream_names_response)"
    )
    assert server_answer(b'{"stream":"REACH_TASKS","seq":5}', None) == (
        "a JetStream publish acknowledgement"
    )
    assert server_answer(b'{"stream":"S","seq":5,"duplicate":true}', None)
    # As nats-server 2.15 writes them (a duplicate's ack is built by hand, with a space).
    assert server_answer(b'{"stream":"A","seq":2,"duplicate": true}', None)
    refused = b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 1"},'
    assert server_answer(refused + b'"stream":"A","seq":0}', None) == (
        "a JetStream error response (wrong last sequence: 1)"
    )
    failed = b'{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled"}}'
    assert server_answer(failed, None) == "a JetStream error response (jetstream not enabled)"
    status = {"Status": "404", "Description": "No Messages"}
    assert server_answer(b"", status) == "a NATS status message (404 No Messages)"
    for sent in (
        b'{"text": "hi"}',
        b'{"stream": "S", "seq": 1, "note": "a payload that only looks like one"}',
        b'{"error": "plain text"}',
        b'{"type": "invoice"}',
        b"[1, 2]",
        b"not json",
        b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # crashed the intake: poison
    ):
        assert server_answer(sent, None) is None, sent
    assert server_answer(b"", {"Status": "404"}) == "a NATS status message (404)"
    assert server_answer(b"body", {"Status": "500"}) is None  # a stored message's own header
    assert server_answer(b"", {"Reach-Kind": "cancel"}) is None  # a cancel without a reason
    assert server_answer(b"", None) == (
        "an empty message without headers (as a stream keeps a NATS status message)"
    )


async def test_a_running_instance_whose_record_is_overwritten_goes_on_from_the_kept_copy(
    broker, start_coordinator
):
    """A server answer aimed at `$KV.reach_workflows.<id>` overwrote a running instance's
    record: its step's result was dropped ("message for an unknown workflow instance"), and
    the instance never ended. The replica's copy of what it wrote last carries it on."""
    held, release = asyncio.Queue[Any](), asyncio.Event()
    agent = _holder("2", held, release)
    flows = {"held-2": wf.chain(wf.step("a", "hold-2"), wf.step("b", "hold-2"))}
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker) as client,
    ):
        invoked = asyncio.create_task(client.invoke("held-2", {"n": 1}, message_id="kept-1"))
        assert await asyncio.wait_for(held.get(), 10) == {"n": 1}
        await _overwrite_record(broker, "kept-1")
        release.set()
        assert await asyncio.wait_for(invoked, 20) == {"held": {"held": {"n": 1}}}
    record = await read_record(broker, "kept-1")
    assert record is not None and record.status == "completed"


async def _overwrite_record(broker, instance_id: str) -> None:  # type: ignore[no-untyped-def]
    """Have the server write its answer to a request over the instance's record."""
    key = f"$KV.{broker.names.workflows_bucket}.{instance_id}"
    await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=key)
    records = await broker.js.key_value(broker.names.workflows_bucket)
    await until_true(lambda: _overwritten(records, instance_id))


async def _overwritten(records, key: str) -> bool:  # type: ignore[no-untyped-def]
    return b"io.nats.jetstream.api" in ((await records.get(key)).value or b"")


async def test_a_server_answer_aimed_at_an_agent_s_queue_is_one_letter_a_minute(
    broker, coordinator, watcher
):
    """The agent reports what is no task, and the coordinator dead-letters it: anyone could
    so fill REACH_DLQ, one server answer at a time. The first says what it is; the rest
    within the minute are dropped."""
    agent = Agent("aimed-at", startup_delay=0)
    agent.handler("noop")(lambda ctx, payload: payload)
    async with agent.running(broker=broker):
        await until_true(lambda: _registered(broker, "aimed-at"))
        with capture_logs() as logs:
            for _ in range(3):
                target = broker.names.dispatch("aimed-at", "P1")
                await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=target)
            await eventually(lambda: sum("dropped" in e["event"] for e in logs) == 2)
        letter = await watcher.dead_letter("invalid_envelope")
    assert letter.error is not None and letter.error.message.startswith(INJECTED)
    assert "reach.agent.aimed-at.<p>" in letter.error.message
    assert len(watcher.dead_letters) == 1


async def _registered(broker, agent_id: str) -> bool:  # type: ignore[no-untyped-def]
    cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
    return await cards.get(agent_id) is not None


async def test_a_server_answer_aimed_at_an_outcome_subject_is_one_letter_a_minute(
    broker, coordinator, watcher
):
    """An outcome that is no event is dead-lettered; server answers aimed at the outcome
    subjects would fill REACH_DLQ one at a time."""
    target = broker.names.event("failed", "t", "m-1", "m-1", "someone")
    with capture_logs() as logs:
        for _ in range(3):
            await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=target)
        await eventually(lambda: sum("dropped" in e["event"] for e in logs) >= 2)
    letter = await watcher.dead_letter("invalid_envelope")
    assert letter.error is not None and letter.error.message.startswith(INJECTED)
    assert len(watcher.dead_letters) == 1
    # Counted where monitoring sees them: the count in the next letter was lost when no
    # other message came, or with a restart (a trial).
    scraped = generate_latest(coordinator.registry).decode()
    # The count is this process's (other tests of the worker drop elsewhere): where="events".
    at = 'reach_messages_dropped_total{where="events"}'
    [line] = [ln for ln in scraped.splitlines() if ln.startswith(at)]
    assert float(line.rsplit(" ", 1)[1]) >= 2


async def test_events_copied_without_headers_are_one_letter_a_minute(broker, coordinator, watcher):
    """Copies of an event with no headers (a direct get's `no_hdr`) were each dead-lettered:
    twenty in an agent's name made twenty letters nobody can delete (a security re-test)."""
    task = envelopes.Task(v=1, message_id="m-2", trace_id="m-2", topic="t")
    failed = encode(event_for(task, "failed", agent_id="alpha"))
    target = broker.names.event("failed", "t", "m-2", "m-2", "alpha")
    with capture_logs() as logs:
        for _ in range(3):
            await broker.publish(target, failed)  # stored as the copy is: no headers
        await eventually(lambda: sum("dropped" in e["event"] for e in logs) >= 2)
    letter = await watcher.dead_letter("invalid_envelope")
    assert letter.error is not None and "direct get asks for none (no_hdr)" in letter.error.message
    assert len(watcher.dead_letters) == 1


async def test_a_lease_forged_by_a_direct_get_answer_does_not_stop_the_coordinator_s_duty(
    tmp_path: Path,
) -> None:
    """An agent wrote a lease record under its own card's key, then direct-got it with the
    reply aimed at `$KV.reach_leases.liveness`: read back by a direct get, it was a lease
    held by someone else for ever, and no replica watched liveness again. Sealed, it is no
    lease of a replica's, and the replica takes the lease back."""
    deployment = SecuredDeployment(tmp_path / "auth")
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        Broker(url, name="mallory", auth=deployment.auth("agent", "mallory")) as mallory,
    ):
        names = mallory.names
        own = f"$KV.{names.agents_bucket}.mallory"
        forged = LeaseRecord("mallory", now_ms() + 3_600_000)
        await mallory.publish(own, encode(forged))
        direct = f"$JS.API.DIRECT.GET.KV_{names.agents_bucket}.{own}"
        # nats-py's own watch: ours takes no server answer for a value (the forged lease).
        kv = await admin.js.key_value(names.leases_bucket)
        watch = await kv.watch("liveness")
        async with asyncio.timeout(10):
            holders = _holders(watch)
            assert await anext(holders) == coordinator.replica_id
            reply = f"$KV.{names.leases_bucket}.liveness"
            await mallory.nc.publish(direct, b"", reply=reply)
            async for holder in holders:
                if holder != coordinator.replica_id:
                    break
            assert holder == "mallory"  # what the server wrote
            assert await anext(holders) == coordinator.replica_id  # taken back


async def _holders(watch) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    while True:
        entry = await watch.updates(timeout=10)
        if entry is not None and entry.value:
            yield decode_as(entry.value, LeaseRecord).holder


async def test_an_instance_overwritten_after_a_coordinator_restart_goes_on_from_its_history(
    broker, start_coordinator
):
    """The replica that kept a copy of the record is gone: the record before the server's
    answer, which the bucket keeps, carries the instance on (it was lost)."""
    held, release = asyncio.Queue[Any](), asyncio.Event()
    agent = _holder("3", held, release)
    flows = {"held-3": wf.chain(wf.step("a", "hold-3"), wf.step("b", "hold-3"))}
    async with ReachClient(broker=broker) as client, agent.running(broker=broker):
        async with start_coordinator(fast(workflows=flows)) as first:
            await eventually(lambda: "holder-3" in first.directory.cards)
            invoked = asyncio.create_task(client.invoke("held-3", {"n": 1}, message_id="hist-1"))
            assert await asyncio.wait_for(held.get(), 10) == {"n": 1}
        async with start_coordinator(fast(workflows=flows)):
            await _overwrite_record(broker, "hist-1")
            release.set()
            assert await asyncio.wait_for(invoked, 20) == {"held": {"held": {"n": 1}}}
    record = await read_record(broker, "hist-1")
    assert record is not None and record.status == "completed"


async def test_a_direct_get_answer_aimed_at_the_clear_subject_clears_no_quarantine(
    broker, coordinator
):
    """An agent staged an agent id under a key of its own and had the server send it to
    `reach.ctl.clear`: the quarantine of that agent (its own, say) was lifted."""
    own = f"$KV.{broker.names.executions_bucket}.x.t.mallory"
    await broker.publish(own, b"mallory")
    stream = f"KV_{broker.names.executions_bucket}"
    await until_true(lambda: _active(coordinator))
    with capture_logs() as logs:
        await broker.nc.publish(f"$JS.API.DIRECT.GET.{stream}.{own}", b"", reply=broker.names.clear)
        await eventually(lambda: _dropped_at(logs, broker.names.clear))
        # Asked for no headers, the copy is the bare id: no request, answered nowhere.
        direct = f"$JS.API.DIRECT.GET.{stream}.{own}"
        await broker.nc.publish(direct, b'{"no_hdr": true}', reply=broker.names.clear)
        await eventually(
            lambda: any(e["event"] == "a clear that is no request ignored" for e in logs)
        )
    assert not any("cleared" in str(e.get("reason", "")) for e in logs)


def _dropped_at(logs: list[dict[str, Any]], subject: str) -> bool:
    return any(
        "a server's answer aimed at a core subject dropped" in e["event"]
        and e["subject"] == subject
        for e in logs
    )


async def _active(coordinator) -> bool:  # type: ignore[no-untyped-def]
    return coordinator.liveness.active


async def test_an_agent_beats_on_over_a_server_answer_aimed_at_its_heartbeat(tmp_path: Path):
    """A caller aimed `$JS.API.STREAM.NAMES` at an agent's heartbeat key: the agent, reading
    past it, asked for a direct get its creds do not grant, waited out each one, and wrote
    no heartbeat again (SUSPECT for good). It writes over it now."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "beater", intents=("noop",))
    agent = Agent("beater", startup_delay=0, heartbeat_interval=0.3)
    agent.handler("noop")(lambda ctx, payload: payload)
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, _),
        agent.running(url, auth=deployment.auth("agent", "beater")),
        Broker(url, name="bob", auth=deployment.auth("caller", "bob")) as bob,
    ):
        key = f"$KV.{admin.names.heartbeats_bucket}.beater"
        kv = await admin.js.key_value(admin.names.heartbeats_bucket)
        await until_true(lambda: _beats(kv))
        await bob.nc.publish("$JS.API.STREAM.NAMES", b"", reply=key)
        await until_true(lambda: _overwritten(kv, "beater"))
        await until_true(lambda: _beats(kv), timeout=5)  # a heartbeat written over it


async def _beats(kv) -> bool:  # type: ignore[no-untyped-def]
    try:  # not there yet: the first beat follows the registration by a moment
        entry = await kv.get("beater")
    except nats.js.errors.KeyNotFoundError:
        return False
    return b'"agent_id":"beater"' in (entry.value or b"")


async def test_an_agent_runs_over_a_done_record_the_server_wrote_on_its_key(tmp_path: Path):
    """mallory staged a `done` record under a key of its own and had the server copy it onto
    the record an honest agent keeps of alice's message: the agent must neither send that
    result nor fail the task (it waited out a read its creds do not grant, five times)."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "honest", intents=("noop",))
    deployment.directory.issue("agent", "mallory", intents=("other",))
    honest = Agent("honest", startup_delay=0)
    honest.handler("noop")(lambda ctx, payload: {"real": payload})
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        honest.running(url, auth=deployment.auth("agent", "honest")),
        Broker(url, name="mallory", auth=deployment.auth("agent", "mallory")) as mallory,
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
    ):
        await eventually(lambda: "honest" in coordinator.directory.cards)
        names = mallory.names
        forged = {
            "v": 1, "message_id": "m-1", "state": "done", "agent_id": "honest", "epoch": 1,
            "attempt": 1, "result": {"FORGED": True}, "caller": "alice",
        }  # fmt: skip
        own = f"$KV.{names.executions_bucket}.x.y.mallory"
        await mallory.publish(own, json.dumps(forged).encode())
        target = f"$KV.{names.executions_bucket}.alice.m-1.honest"
        direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
        await mallory.nc.publish(direct, b"", reply=target)
        kv = await admin.js.key_value(names.executions_bucket)
        await until_true(lambda: _forged(kv, "alice.m-1.honest"))
        result = await alice.invoke("noop", {"n": 1}, message_id="m-1")
    assert result == {"real": {"n": 1}}


async def _forged(kv, key: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        return b"FORGED" in ((await kv.get(key)).value or b"")
    except Exception:  # not there yet
        return False


def _holder(n: str, held: asyncio.Queue[Any], release: asyncio.Event) -> Agent:
    """Agent `holder-N` serving `hold-N`: it puts each payload in ``held``, then waits."""
    agent = Agent(f"holder-{n}", startup_delay=0)

    @agent.handler(f"hold-{n}")
    async def hold(ctx: TaskContext, payload: Any) -> Any:
        await held.put(payload)
        await release.wait()
        return {"held": payload}

    return agent


@pytest.mark.parametrize("asked", [b"", b'{"no_hdr": true}'], ids=["headers", "no_hdr"])
async def test_a_task_staged_and_direct_got_into_an_agent_s_queue_is_not_run(
    broker, coordinator, watcher, asked: bytes
) -> None:
    """An agent (or a worker) wrote a task envelope under a key of its own and direct-got it
    with the reply aimed at another agent's queue: the stream kept the server's answer, and
    the agent ran it, as alice's, past the coordinator, answering where the attacker
    listened (a security re-test). It is nobody's dispatch: dead-lettered, saying so."""
    names = broker.names
    seen: list[Any] = []
    agent = Agent("victim-1", startup_delay=0)

    @agent.handler("echo")
    async def echo(ctx: TaskContext, payload: Any) -> Any:
        seen.append(payload)
        return payload

    forged = encode(
        envelopes.Task(
            v=1, message_id="forged-1", trace_id="forged-1", topic="echo",
            payload={"approved": True}, caller="alice",
            reply_to="reach.reply.evil.box1.victim-1",
        )
    )  # fmt: skip
    own = f"$KV.{names.executions_bucket}.x.t.evil"
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        await until_true(lambda: _registered(broker, "victim-1"))
        await broker.publish(own, forged)
        direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
        await broker.nc.publish(direct, asked, reply=names.dispatch("victim-1", "P1"))
        letter = await watcher.dead_letter("invalid_envelope")
        # Anything it had run would have run before this, from the same queue.
        assert await client.invoke("echo", {"real": 1}) == {"real": 1}
    assert seen == [{"real": 1}]
    assert letter.error is not None and "direct get" in letter.error.message
    assert not [e for e in watcher.events if e.message_id == "forged-1"]


async def test_a_server_answer_over_a_running_claim_loses_no_outcome(tmp_path: Path):
    """bob aimed `$JS.API.STREAM.NAMES` at the record an agent keeps of alice's running task:
    the agent's outcome write was refused, it could not read the key (its creds grant no read
    past it), and the task was lost, dead-lettered after every delivery failed to record it (a
    security re-test). Nobody's write over its claim leaves the claim its own."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "holder-9", intents=("hold-9",))
    held: asyncio.Queue[Any] = asyncio.Queue()
    release = asyncio.Event()
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        _holder("9", held, release).running(url, auth=deployment.auth("agent", "holder-9")),
        Broker(url, name="bob", auth=deployment.auth("caller", "bob")) as bob,
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
    ):
        await eventually(lambda: "holder-9" in coordinator.directory.cards)
        invoked = asyncio.create_task(alice.invoke("hold-9", {"n": 1}, message_id="o-1"))
        assert await asyncio.wait_for(held.get(), 10) == {"n": 1}
        key = f"$KV.{admin.names.executions_bucket}.alice.o-1.holder-9"
        await bob.nc.publish("$JS.API.STREAM.NAMES", b"", reply=key)
        kv = await admin.js.key_value(admin.names.executions_bucket)
        await until_true(lambda: _overwritten(kv, "alice.o-1.holder-9"))
        release.set()
        assert await asyncio.wait_for(invoked, 15) == {"held": {"n": 1}}
        record = decode_as((await kv.get("alice.o-1.holder-9")).value, Execution)
    assert record.state == "done" and record.result == {"held": {"n": 1}}


async def test_a_card_overwritten_by_a_server_answer_does_not_take_the_epoch_back(
    tmp_path: Path,
):
    """bob aimed `$JS.API.STREAM.NAMES` at an agent's card: its next process found no card it
    could read and registered with epoch 1, and a stalled older process of epoch 3 fenced the
    healthy new one off when it woke (a security re-test). An unreadable card's revision is
    past every epoch before it."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "epochal", intents=("noop",))
    auth = deployment.auth("agent", "epochal")
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, _),
        Broker(url, name="bob", auth=deployment.auth("caller", "bob")) as bob,
    ):
        kv = await admin.js.key_value(admin.names.agents_bucket)
        epochs = []
        for _ in range(2):
            agent = Agent("epochal", startup_delay=0)
            agent.handler("noop")(lambda ctx, payload: payload)
            async with agent.running(url, auth=auth):
                epochs.append(decode_as((await kv.get("epochal")).value, AgentCard).epoch)
        await bob.nc.publish(
            "$JS.API.STREAM.NAMES", b"", reply=f"$KV.{admin.names.agents_bucket}.epochal"
        )
        await until_true(lambda: _overwritten(kv, "epochal"))
        agent = Agent("epochal", startup_delay=0)
        agent.handler("noop")(lambda ctx, payload: payload)
        async with agent.running(url, auth=auth):
            after = decode_as((await kv.get("epochal")).value, AgentCard).epoch
    assert epochs == [1, 2]
    assert after > 2


async def _forge_event(agent: Broker, event: Event, sender: str, *, no_hdr: bool) -> None:
    """What a security re-test did as agent ``mallory``: write ``event`` under a key of its
    own, then direct-get it with the reply aimed at the event's subject in ``sender``'s
    name. The stream stores the server's answer there, with the content mallory chose;
    asked for no headers (``no_hdr``), with nothing else either."""
    names = agent.names
    own = f"$KV.{names.executions_bucket}.x.{event.message_id}.{agent.name}"
    await agent.publish(own, encode(event))
    subject = names.event(event.event, event.topic, event.trace_id, event.message_id, sender)
    direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
    body = b'{"no_hdr": true}' if no_hdr else b""
    await agent.nc.publish(direct, body, reply=subject)


async def test_coordinator_events_forged_by_a_direct_get_answer_vouch_for_nothing(
    tmp_path: Path,
) -> None:
    """An agent forged `routed` (the coordinator's) naming itself for another caller's
    workflow step, then answered the step: the step completed with its output, and the real
    result was dropped. A forged `workflow_completed` made alice's trace, `result()` and
    `reach trace` say the running instance had ended. Events stored as a server's answer
    are nobody's: they vouch for nothing and are no part of a trace."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "holder-5", intents=("hold-5",))
    held, release = asyncio.Queue[Any](), asyncio.Event()
    flows = {"held-5": wf.chain(wf.step("a", "hold-5"))}
    async with (
        sealed_deployment(deployment, tmp_path / "server", flows) as (url, admin, coordinator),
        _holder("5", held, release).running(url, auth=deployment.auth("agent", "holder-5")),
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
        Broker(url, name="mallory", auth=deployment.auth("agent", "mallory")) as bad,
        Watcher(admin) as watcher,
    ):
        await eventually(lambda: "holder-5" in coordinator.directory.cards)
        instance = f"flow-{uuid.uuid4().hex[:8]}"
        invoked = asyncio.create_task(alice.invoke("held-5", {"n": 1}, message_id=instance))
        assert await asyncio.wait_for(held.get(), 10) == {"n": 1}
        step = step_message_id(instance, "a", 1)
        about = Task(v=1, message_id=step, trace_id=instance, topic="hold-5")
        routed = event_for(about, "routed", agent_id="mallory")
        await _forge_event(bad, routed, COORDINATOR, no_hdr=True)
        start = Task(v=1, message_id=instance, trace_id=instance, topic="held-5", caller="alice")
        ended = event_for(start, "workflow_completed", workflow="held-5", result={"by": "bad"})
        await _forge_event(bad, ended, COORDINATOR, no_hdr=False)
        forged = Result(
            v=1, message_id=step, trace_id=instance, topic="hold-5", result={"by": "mallory"}
        )
        as_sent = {"Reach-Kind": "result", "Reach-Trace-Id": instance}  # as an agent sends it
        await bad.publish(
            f"{bad.names.workflow_reply(instance)}.mallory", encode(forged), headers=as_sent
        )
        await eventually(lambda: _alerted_about(watcher, step), timeout=30)
        trace = await alice.status(instance)
        release.set()
        assert await asyncio.wait_for(invoked, 10) == {"held": {"n": 1}}
    [alert] = _alerted_about(watcher, step)
    assert (alert.agent_id, alert.detail["problem"]) == ("mallory", "impersonation")
    assert not [e for e in trace if e.event == "workflow_completed"]


def _alerted_about(watcher: Watcher, message_id: str) -> list[Event]:
    return [
        e for e in watcher.events if e.event == "alert" and e.detail["message_id"] == message_id
    ]


async def test_a_task_stored_as_a_headerless_answer_is_nobody_s_on_a_secured_server(
    tmp_path: Path,
) -> None:
    """A direct get asking for no headers (`no_hdr`) is answered with the stored body alone:
    an agent had a task stored on `reach.task.echo._coordinator` naming alice as its caller,
    at P0, replies to its own box, and it ran as alice's, charged to nobody's quota. On a
    secured server a task carries headers (the SDKs' always do)."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "echo-1", intents=("echo",))
    runs: list[object] = []
    echo = Agent("echo-1", startup_delay=0)

    @echo.handler("echo")
    async def answer(ctx: TaskContext, payload: Any) -> Any:
        runs.append(payload)
        return payload

    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        echo.running(url, auth=deployment.auth("agent", "echo-1")),
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
        Broker(url, name="mallory", auth=deployment.auth("agent", "mallory")) as bad,
        Watcher(admin) as watcher,
    ):
        await eventually(lambda: "echo-1" in coordinator.directory.cards)
        names = bad.names
        own = f"$KV.{names.executions_bucket}.x.forged.mallory"
        direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
        for sender in (COORDINATOR, "alice"):
            forged = alice.task("echo", {"forged": sender}, priority="P0")
            await bad.publish(own, encode(forged))
            await bad.nc.publish(direct, b'{"no_hdr": true}', reply=names.task("echo", sender))
        letter = await watcher.dead_letter("invalid_envelope", topic="echo")
        assert await alice.invoke("echo", {"n": 1}) == {"n": 1}
    assert runs == [{"n": 1}]
    assert letter.error is not None and "direct get asks for none (no_hdr)" in letter.error.message


async def test_an_advisory_copied_by_a_direct_get_ends_no_task(broker, coordinator) -> None:
    """An agent wrote a max-deliveries advisory under a key of its own and aimed its direct
    get at the advisory subject of a dispatch stream: alice's running task was dead-lettered
    `max_deliveries` and deleted (a security re-test). The copy's headers give it away."""
    names = broker.names
    stream = names.dispatch_stream("P1")
    task = envelopes.Task(v=1, message_id="running-1", trace_id="running-1", topic="flight")
    stored = await broker.publish(
        names.dispatch("alpha", "P1"), encode(task), headers={"Reach-Kind": "task"}
    )
    advisory = {
        "type": "io.nats.jetstream.advisory.v1.max_deliver",
        "stream": stream,
        "consumer": "agent-alpha-p1",
        "stream_seq": stored.seq,
        "deliveries": 5,
    }
    own = f"$KV.{names.executions_bucket}.x.adv.mallory"
    await broker.publish(own, json.dumps(advisory).encode())
    target = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.agent-alpha-p1"
    with capture_logs() as logs:
        direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
        await broker.nc.publish(direct, b"", reply=target)
        await eventually(lambda: any("copied by a direct get" in e["event"] for e in logs))
    info = await broker.js.stream_info(stream)
    assert info.state.messages == 1  # still there: nothing ended it


async def test_registrations_that_are_no_requests_take_no_slot(broker, coordinator) -> None:
    """Bare copies of `{"agent_id": "ghost-N"}` aimed at `reach.ctl.register.ghost-N` (a
    direct get's no_hdr answer has no reply subject) each took a slot of the 20 a second
    every agent shares: a real agent's registration was told to come back later."""
    names = broker.names
    await until_true(lambda: _active(coordinator))
    for n in range(40):
        body = envelopes.encode(envelopes.RegisterRequest(agent_id=f"ghost-{n}"))
        await broker.nc.publish(names.register(f"ghost-{n}"), body)
    asked = envelopes.encode(envelopes.RegisterRequest(agent_id="real-1"))
    answer = await broker.request(names.register("real-1"), asked, timeout=5)
    reply = envelopes.decode_as(answer.data, envelopes.RegisterReply)
    assert reply.ok, reply


def test_the_first_answers_dropped_in_a_minute_are_said_as_warnings() -> None:
    """An operator's `nats pub` with no header, three times on a secured server: one letter,
    and the other two were said nowhere but at debug. A few are warnings now (a flood's rest
    stays at debug), with why."""
    answers = ServerAnswers()
    refusal = envelopes.ServerAnswer("not a message of anyone's: no headers")
    with capture_logs() as logs:
        letters = [answers.to_letter(refusal, "reach.task.summarize") for _ in range(8)]
    assert letters[0] is refusal and letters[1:] == [None] * 7
    assert [e["log_level"] for e in logs] == ["warning"] * 5 + ["debug"] * 2
    assert logs[0]["why"] == str(refusal)
