"""Cancelling a workflow instance, on a real server: a caller cancels the instances it
started (and no other caller's), with its own creds on a secured server; and how a cancelled,
timed-out or failed instance ends is never `retryable`."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext, TaskFailed
from agentreach.auth import push, roles
from agentreach.broker import (
    Auth,
    Broker,
    BrokerTimeout,
    Names,
    Topology,
    provision,
    read_stream,
)
from agentreach.cli.workflow_views import clock
from agentreach.cli.workflows import already
from agentreach.coordinator import Coordinator, RateLimits
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import WorkflowEngine, cancel, read_record
from agentreach.coordinator.workflows.actions import message_id_of
from agentreach.coordinator.workflows.answers import cancelled_by
from agentreach.coordinator.workflows.run import BY_OPERATOR
from agentreach.envelopes import RateLimit, WorkflowRecord
from agentreach.envelopes.headers import control_headers, task_headers
from tests.cli.conftest import reach_argv, reach_command, run
from tests.conftest import FAST
from tests.e2e.routing_support import fast, serving
from tests.secured import SecuredDeployment, secured_server
from tests.support import eventually, held, until_true

HELD = "held-flow"


@dataclass
class Secured:
    """A secured server with a coordinator serving ``held-flow`` (one step an agent holds
    until ``release``), and the operator's connection."""

    deployment: SecuredDeployment
    url: str
    admin: Broker
    server_log: list[str]
    held: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def caller(self, name: str) -> Auth:
        return self.deployment.auth("caller", name)

    def violations(self, connection: str) -> int:
        tag = f':{connection}"'
        return sum(1 for line in self.server_log if tag in line and "Violation" in line)

    async def reach_as(self, name: str, *args: str) -> tuple[int, str, str]:
        """`reach ARGS` as the caller ``name``, with nothing but its creds file."""
        creds = self.caller(name).creds
        argv = [reach_command(), *args, "--nats-url", self.url, "--creds", str(creds)]
        done = await run(*argv, env={"NATS_URL": "", "NATS_CREDS": ""})
        return done.returncode, done.stdout, done.stderr


@contextlib.asynccontextmanager
async def secured(tmp_path: Path, **settings: Any) -> AsyncIterator[Secured]:
    deployment = SecuredDeployment(tmp_path / "auth")
    server_log: list[str] = []
    held = {HELD: wf.chain(wf.step("a", "hold-step"))}
    config = msgspec.structs.replace(FAST, workflows=held, **settings)
    async with (
        secured_server(deployment, tmp_path / "server", on_log=server_log.append) as server,
        Broker(server.url, name="admin", auth=deployment.admin) as admin,
        Broker(server.url, name="coordinator", auth=deployment.coordinator) as own,
    ):
        await provision(admin, Topology.default(admin.names))
        arena = Secured(deployment, server.url, admin, server_log)
        agent = Agent("holder", startup_delay=0)

        @agent.handler("hold-step")
        async def hold_step(ctx: TaskContext, payload: Any) -> Any:
            await arena.held.put(payload)
            await arena.release.wait()
            return {"held": payload}

        async with (
            Coordinator(own, config).running() as coordinator,
            agent.running(server.url, auth=deployment.auth("agent", "holder")),
        ):
            await eventually(lambda: "holder" in coordinator.directory.cards)
            try:
                yield arena
            finally:
                arena.release.set()  # the agent's drain need not wait for it


async def test_a_caller_cancels_its_own_workflow_and_no_other_caller_s(tmp_path: Path) -> None:
    """bob may publish a cancel only in his own name, and the coordinator refuses it for
    alice's instance, which runs on; bob's `reach workflows cancel` says it is none of his.
    alice's own `reach workflows cancel` ends it: her invoke hears `cancelled`, not
    retryable, saying she cancelled it."""
    async with (
        secured(tmp_path) as arena,
        ReachClient(arena.url, name="alice", auth=arena.caller("alice")) as alice,
        Broker(arena.url, name="bob", auth=arena.caller("bob")) as bob,
    ):
        instance = f"flow-{uuid.uuid4().hex[:8]}"
        invoked = asyncio.create_task(alice.invoke(HELD, {"n": 1}, message_id=instance))
        assert await asyncio.wait_for(arena.held.get(), 10) == {"n": 1}

        # Not as an operator (the bare subject), nor in alice's name: the server refuses both.
        bare = bob.names.workflow_cancel(instance)
        await _refused_by_the_server(arena, bob, bare, f"{bare}.alice")
        # In his own name the server takes it, and the coordinator refuses it.
        with capture_logs() as logs:
            await bob.publish(f"{bare}.bob", b"", headers=control_headers("cancel"))
            await eventually(lambda: any("cancel refused" in e["event"] for e in logs))
        refused = next(e for e in logs if "cancel refused" in e["event"])
        assert refused["asker"] == "bob" and refused["started_by"] == "alice"
        record = await read_record(arena.admin, instance)
        assert record is not None and record.status == "running"
        code, out, err = await arena.reach_as("bob", "workflows", "cancel", instance)
        assert code == 1 and "among bob's own messages" in err, (out, err)

        code, out, err = await arena.reach_as("alice", "workflows", "cancel", instance, "moved")
        assert code == 0, err
        assert out.strip() == f"{instance}: cancelled"
        with pytest.raises(TaskFailed) as stopped:
            await asyncio.wait_for(invoked, 10)
    error = stopped.value.error
    assert (error.type, error.retryable) == ("cancelled", False)
    assert error.message == "cancelled by its caller 'alice': moved"
    assert stopped.value.ending == "cancelled"


async def test_a_caller_over_its_quota_hears_its_cancel_was_not_acted_on(tmp_path: Path) -> None:
    """Cancels are charged to the caller's quota as its tasks are: alice's start and her
    signal took both her tokens, and `reach workflows cancel` with her creds says the
    cancel was not acted on, why and when to send it again (exit 1); her instance runs on."""
    quota = RateLimits(callers={"alice": RateLimit(rate=0.1, burst=2)})  # a token per 10 s
    async with (
        secured(tmp_path, rate_limits=quota) as arena,
        ReachClient(arena.url, name="alice", auth=arena.caller("alice")) as alice,
    ):
        instance = f"flow-{uuid.uuid4().hex[:8]}"
        invoked = asyncio.create_task(alice.invoke(HELD, {"n": 3}, message_id=instance))
        await asyncio.wait_for(arena.held.get(), 10)
        assert not (await alice.signal_workflow(instance, "go")).taken  # a chain takes none
        code, out, err = await arena.reach_as("alice", "workflows", "cancel", instance)
        record = await read_record(arena.admin, instance)
        arena.release.set()
        assert await asyncio.wait_for(invoked, 10) == {"held": {"n": 3}}
    assert code == 1, (out, err)
    said = f"workflow {instance!r}: cancel not acted on: caller 'alice' is over its quota 'alice'"
    assert out.startswith(said), out
    wait_ms = int(out.split("send it again in ")[1].split(" ms")[0])
    assert 0 < wait_ms <= 10_000
    assert record is not None and record.status == "running"


async def test_a_caller_s_cancel_of_an_ended_instance_says_how_it_ended(tmp_path: Path) -> None:
    """Once alice's instance completed, her cancel changes nothing and says so."""
    async with (
        secured(tmp_path) as arena,
        ReachClient(arena.url, name="alice", auth=arena.caller("alice")) as alice,
    ):
        arena.release.set()
        instance = f"flow-{uuid.uuid4().hex[:8]}"
        assert await alice.invoke(HELD, {"n": 2}, message_id=instance) == {"held": {"n": 2}}
        code, out, err = await arena.reach_as("alice", "workflows", "cancel", instance)
    assert code == 1, err
    assert out.startswith(f"{instance}: already completed at ")


def test_a_caller_s_reason_names_the_caller() -> None:
    """An operator's cancel says its reason (or that an operator cancelled it); a caller's
    always names the caller, whatever reason it gives."""
    assert cancelled_by(None, "", BY_OPERATOR) == BY_OPERATOR
    assert cancelled_by(None, "maintenance", BY_OPERATOR) == "maintenance"
    assert cancelled_by("alice", "", BY_OPERATOR) == "cancelled by its caller 'alice'"
    said = cancelled_by("alice", BY_OPERATOR, BY_OPERATOR)
    assert said == f"cancelled by its caller 'alice': {BY_OPERATOR}"


# -- how instances end: never retryable ---------------------------------------------------


def _flows() -> dict[str, wf.WorkflowSpec]:
    return {
        "slow": wf.chain(wf.step("a", "stall", timeout_s=0.3)),
        "held": wf.chain(wf.step("a", "stall")),
        "broken": wf.chain(wf.step("a", "crash")),
    }


def _stalling(gate: asyncio.Event) -> Agent:
    agent = Agent("staller", startup_delay=0)

    @agent.handler("stall", capacity=4)
    async def stall(ctx: TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    @agent.handler("crash", max_attempts=1)  # no retries: what they would add is not tested
    async def crash(ctx: TaskContext, payload: Any) -> Any:
        raise ConnectionError("the backend went away")  # an ordinary, retryable failure

    return agent


async def _ended(broker: Broker, instance: str) -> WorkflowRecord:
    async def finished() -> WorkflowRecord | None:
        record = await read_record(broker, instance)
        return record if record is not None and record.finished else None

    return await until_true(finished)  # type: ignore[no-any-return]


async def test_cancelled_timed_out_and_failed_instances_are_not_retryable(
    broker, start_coordinator, watcher
):
    """A step past its `timeout_s`, an operator's cancel, and a step that failed with a
    retryable error all end the instance with `retryable: false`, in the starter's error,
    the `workflow_*` event and the dead letter; the step keeps its own error as it was.
    The coordinator's "dead-lettered" line names the instance."""
    gate = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=_flows())) as coordinator,
        serving(broker, coordinator, _stalling(gate)),
        ReachClient(broker=broker) as client,
    ):
        with capture_logs() as logs, pytest.raises(TaskFailed) as timed_out:
            await client.invoke("slow", {"n": 1}, message_id="slow-1")
        letter = await watcher.dead_letter("workflow_failed", message_id="slow-1")

        held = asyncio.create_task(client.invoke("held", {"n": 2}, message_id="held-1"))
        await watcher.event("accepted", message_id=message_id_of("held-1", "a", 1))
        await cancel(broker, "held-1")
        with pytest.raises(TaskFailed) as cancelled:
            await held
        cancel_event = await watcher.event("workflow_cancelled", message_id="held-1")

        with pytest.raises(TaskFailed) as failed:
            await client.invoke("broken", {"n": 3}, message_id="broken-1")
        broken = await _ended(broker, "broken-1")
        gate.set()
    assert timed_out.value.error.type == "timeout" and not timed_out.value.error.retryable
    said = {
        (e["message_id"], e["topic"], e["reason"]) for e in logs if e["event"] == "dead-lettered"
    }
    assert ("slow-1", "slow", "workflow_failed") in said  # names the instance
    assert letter.error is not None and not letter.error.retryable
    assert cancelled.value.error.type == "cancelled" and not cancelled.value.error.retryable
    assert cancel_event.detail["error"]["retryable"] is False
    assert failed.value.error.type == "ConnectionError" and not failed.value.error.retryable
    assert failed.value.error.retry_after_ms is None
    step_error = broken.steps["a"].error
    assert step_error is not None and step_error.retryable  # the agent's, as it said it
    assert failed.value.ending == "workflow_failed"


async def test_the_cancel_of_an_instance_that_ran_under_a_reused_id_says_when_it_ended(
    broker, start_coordinator, watcher
):
    """A start sent again under an id used before (once the stream forgot the id: a
    restarted server forgets consumed ones) is answered from the instance that ran then,
    and runs nothing: `reach workflows cancel` says when that one ended."""
    gate = asyncio.Event()
    gate.set()
    async with (
        start_coordinator(fast(workflows=_flows())) as coordinator,
        serving(broker, coordinator, _stalling(gate)),
        ReachClient(broker=broker) as client,
    ):
        await client.invoke("held", {"n": 1}, message_id="reused-1")
        again = client.task("held", {"n": 1}, message_id="reused-1")  # the same start
        # No Nats-Msg-Id: what the stream sees once it has forgotten the id.
        headers = {k: v for k, v in task_headers(again).items() if k != "Nats-Msg-Id"}
        subject = broker.names.task("held", client.caller)
        with capture_logs() as logs:
            await broker.publish(subject, envelopes.encode(again), headers=headers)
            await eventually(lambda: any("answered again" in e["event"] for e in logs))
        cancelled = await run(*reach_argv(broker, "workflows", "cancel", "reused-1"))
    assert watcher.count("workflow_started") == 1
    assert cancelled.returncode == 1, cancelled.stderr
    assert cancelled.stdout.startswith("reused-1: already completed at ")


def test_an_instance_that_ended_long_ago_is_said_to_be_an_id_used_again() -> None:
    """Ended a minute or more ago, it is the instance that ran under an id used again."""
    ended = 1_000_000
    just = already("r", "completed", ended, ended + 5_000)
    assert just == f"r: already completed at {clock(ended)}"
    long_ago = already("r", "completed", ended, ended + 60_000)
    assert long_ago.startswith(f"{just}, 1 min ago (if you sent its start again since")
    assert "not run again; send it under a new message id" in long_ago


async def test_an_operator_s_cancel_that_an_end_overtakes_says_so(broker: Broker) -> None:
    """The cancel is asked of a running instance, and it ends otherwise before a coordinator
    applies the cancel (another replica applied a result stored before the cancel):
    `reach workflows cancel` says it completed before the cancel, and exits 1."""
    names = broker.names
    flows = _flows()
    task = envelopes.Task(v=1, message_id="overtaken", trace_id="t", topic="held", payload={})
    await WorkflowEngine(broker, flows).start(task, seen_before=False)  # no coordinator runs
    argv = reach_argv(broker, "workflows", "cancel", "overtaken", "--wait", "30")
    cancelling = asyncio.create_task(run(*argv))

    async def asked() -> bool:
        stored = await read_stream(broker, names.workflows_stream, names.workflow_cancel(">"))
        return bool(stored)

    await until_true(asked)  # read as running, and the cancel sent: now the end overtakes it
    records = await broker.bucket(names.workflows_bucket, WorkflowRecord)

    def completed(record: WorkflowRecord | None) -> WorkflowRecord | None:
        assert record is not None and record.status == "running"
        return msgspec.structs.replace(record, status="completed", result={}, ended_ms=1)

    assert (await records.cas("overtaken", completed)).written
    cancelled = await cancelling
    assert cancelled.returncode == 1, cancelled.stderr
    assert cancelled.stdout.splitlines()[-1] == "overtaken: completed before the cancel took effect"


async def _refused_by_the_server(arena: Secured, actor: Broker, *subjects: str) -> None:
    """Publishes on ``subjects`` as ``actor`` (bob), each a permission violation."""
    before = arena.violations("bob")
    for subject in subjects:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(actor.publish(subject, b""), 0.5)
    await eventually(lambda: arena.violations("bob") >= before + len(subjects))


async def test_a_caller_signals_only_in_its_own_name(tmp_path: Path) -> None:
    """A signal's last token names its caller: bob's creds may not send one as an operator
    (the bare subject) or as alice, and one in his own name is stored (the coordinator then
    acts only on an instance bob started: tests/agents/test_workflow_control.py). With
    caller creds `reach workflows signal` signals the caller's own instance: alice's chain
    has no state to take an event, and bob's try is none of his."""
    async with (
        secured(tmp_path) as arena,
        ReachClient(arena.url, name="alice", auth=arena.caller("alice")) as alice,
        Broker(arena.url, name="bob", auth=arena.caller("bob")) as bob,
    ):
        instance = f"flow-{uuid.uuid4().hex[:8]}"
        invoked = asyncio.create_task(alice.invoke(HELD, {"n": 1}, message_id=instance))
        await asyncio.wait_for(arena.held.get(), 10)
        bare = bob.names.workflow_signal(instance, "approve")
        await _refused_by_the_server(arena, bob, bare, f"{bare}.alice")
        stored = await bob.publish(f"{bare}.bob", b"", headers=control_headers("signal"))
        assert stored.stream == bob.names.workflows_stream
        code, out, err = await arena.reach_as("bob", "workflows", "signal", instance, "approve")
        assert code == 1 and "among bob's own messages" in err, (out, err)
        code, out, err = await arena.reach_as("alice", "workflows", "signal", instance, "go")
        assert (code, out.strip()) == (1, f"{instance}: no state waits for go; not taken"), err
        arena.release.set()
        await asyncio.wait_for(invoked, 10)


async def test_a_push_gives_the_callers_of_a_deployment_made_before_their_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment whose account was signed with the caller template of before (no
    workflow cancels): `reach auth push` re-signs it with this version's templates, and a
    caller may then publish a cancel in its own name, with no server restart."""
    deployment = SecuredDeployment(tmp_path / "auth")
    directory = deployment.directory
    current = roles.caller

    def before(names: Names) -> roles.Permissions:
        template = current(names)
        template["pub"]["allow"].remove(f"{names.workflow_cancel('*')}.{roles.NAME}")
        return template

    monkeypatch.setattr(roles, "caller", before)
    directory.write_account()  # as `reach auth init` of the older version left it
    monkeypatch.setattr(roles, "caller", current)
    alice = deployment.auth("caller", "alice")
    async with secured_server(deployment, tmp_path / "server") as server:
        async with Broker(server.url, auth=deployment.admin) as admin:
            await provision(admin, Topology.default(admin.names))
        subject = f"{Names().workflow_cancel('some-instance')}.alice"
        async with Broker(server.url, name="alice", auth=alice) as caller:
            with pytest.raises(BrokerTimeout):
                await caller.publish(subject, b"", timeout=0.5)
        await push(directory, server.url)
        async with Broker(server.url, name="alice", auth=alice) as caller:
            assert (await caller.publish(subject, b"")).stream == Names().workflows_stream


# -- what a cancel stops: nothing is dispatched for it afterwards --------------------------


def _recording(agent_id: str, runs: list[int], gate: asyncio.Event | None = None) -> Agent:
    agent = Agent(agent_id, startup_delay=0)

    @agent.handler("chore", max_attempts=3)
    async def chore(ctx: TaskContext, payload: Any) -> Any:
        runs.append(ctx.attempt)
        if gate is not None:
            await gate.wait()
            raise ConnectionError("the backend went away")  # retryable: retried if allowed
        return payload

    return agent


async def test_a_step_waiting_for_its_agent_is_not_dispatched_after_a_cancel(
    broker, start_coordinator, watcher
):
    """The step's agent is stopped, so its task waits in intake; the instance is cancelled;
    the agent comes back: the step's task is refused as cancelled, its handler never runs."""
    runs: list[int] = []
    flows = {"queued": wf.chain(wf.step("a", "chore"))}
    async with start_coordinator(fast(workflows=flows)) as coordinator:
        async with serving(broker, coordinator, _recording("chore-q", runs)):
            pass
        await eventually(lambda: coordinator.directory.cards["chore-q"].status == "stopped")
        async with ReachClient(broker=broker) as client:
            await client.publish("queued", {"n": 1}, message_id="queued-1")
        step_id = message_id_of("queued-1", "a", 1)
        await watcher.event("workflow_started", message_id="queued-1")

        async def step_sent() -> bool:
            record = await read_record(broker, "queued-1")
            return record is not None and record.steps.get("a") is not None

        await until_true(step_sent)
        await cancel(broker, "queued-1")
        await watcher.event("workflow_cancelled", message_id="queued-1")
        async with serving(broker, coordinator, _recording("chore-q", runs)):
            refused = await watcher.event("rejected", message_id=step_id, timeout=20)
    assert refused.detail["error"]["type"] == "cancelled"
    assert "step 'a' of workflow 'queued-1' is cancelled" in refused.detail["error"]["message"]
    assert runs == []


async def test_a_step_s_failed_attempt_is_not_retried_after_a_cancel(
    broker, start_coordinator, watcher
):
    """A step's first attempt runs when the instance is cancelled, then fails (retryable):
    its retry is refused as cancelled, not run."""
    runs: list[int] = []
    gate = asyncio.Event()
    flows = {"flaky": wf.chain(wf.step("a", "chore"))}
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, _recording("chore-f", runs, gate)),
    ):
        async with ReachClient(broker=broker) as client:
            await client.publish("flaky", {"n": 1}, message_id="flaky-1")
        step_id = message_id_of("flaky-1", "a", 1)
        await watcher.event("accepted", message_id=step_id)
        await cancel(broker, "flaky-1")
        await watcher.event("workflow_cancelled", message_id="flaky-1")
        gate.set()
        refused = await watcher.event("rejected", message_id=step_id, timeout=20)
    assert refused.detail["error"]["type"] == "cancelled"
    assert runs == [1]


async def test_a_cancel_stored_before_a_step_s_result_dispatches_no_further_step(
    broker, start_coordinator, watcher
):
    """No coordinator ran while the instance was cancelled and then its running step `a`
    finished: after the restart the cancel, stored first, is applied first. The result,
    read without a round trip, overtook the cancel's reads, and step `b` was dispatched
    (and refused as cancelled) after the cancel that should have stopped it."""
    agent, gate, runs = held("chore-stored", "chore")
    flows = {"stored": wf.chain(wf.step("a", "chore"), wf.step("b", "chore"))}
    names = broker.names
    async with agent.running(broker=broker):
        async with start_coordinator(fast(workflows=flows)) as coordinator:
            await eventually(lambda: "chore-stored" in coordinator.directory.cards)
            async with ReachClient(broker=broker) as client:
                await client.publish("stored", {"n": 1}, message_id="stored-1")
            await watcher.event("accepted", message_id=message_id_of("stored-1", "a", 1))
        await cancel(broker, "stored-1")
        gate.set()

        async def result_stored() -> bool:
            replies = names.workflow_reply("stored-1") + ".>"
            stored = await read_stream(broker, names.workflows_stream, replies)
            return any(b'"result"' in m.data for m in stored)

        await until_true(result_stored)
        async with start_coordinator(fast(workflows=flows)):
            await watcher.event("workflow_cancelled", message_id="stored-1")
            record = await read_record(broker, "stored-1")
    assert record is not None and record.status == "cancelled"
    assert "b" not in record.steps and runs == [message_id_of("stored-1", "a", 1)]
