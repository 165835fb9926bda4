"""A replica that starts resumes the unfinished workflow instances, on a real server, while
the other replicas (and its own consumer) go on moving them: what ended meanwhile stays
ended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, BrokerError, Bucket, Delivery
from agentreach.coordinator import Coordinator, consumption
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.routing.abandoned import still_wanted
from agentreach.coordinator.workflows import WorkflowEngine, cancel
from agentreach.coordinator.workflows.actions import message_id_of
from agentreach.envelopes import Task, WorkflowRecord
from tests.e2e.routing_support import fast, serving
from tests.support import delivered_again_as_new, echoing

FLOWS = {"held": wf.chain(wf.step("a", "hold-step"))}
PAIR = {"pair": wf.chain(wf.step("a", "first-step"), wf.step("b", "second-step"))}


class StaleSnapshot:
    """The workflow records, whose snapshot is out of date once returned: ``meanwhile``
    (another replica acting) runs between the read and the return."""

    def __init__(self, bucket: Bucket[WorkflowRecord], meanwhile: Callable[[], Awaitable[None]]):
        self._bucket = bucket
        self._meanwhile = meanwhile

    async def snapshot(self) -> Any:
        taken = await self._bucket.snapshot()
        await self._meanwhile()
        return taken

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bucket, name)


def read_from_a_replica_behind(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Direct gets of the workflow records not sent to the leader say "no instance yet"."""
    read = Bucket._read

    async def from_a_replica_behind(self, key, *, leader=False):  # type: ignore[no-untyped-def]
        if self.name == broker.names.workflows_bucket and not leader:
            return None
        return await read(self, key, leader=leader)

    monkeypatch.setattr(Bucket, "_read", from_a_replica_behind)


def holding(gate: asyncio.Event) -> Agent:
    agent = Agent("holder", startup_delay=0)

    @agent.handler("hold-step", capacity=4)
    async def hold(ctx: TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    return agent


async def test_a_starting_replica_resumes_only_what_has_not_ended_since_its_snapshot(
    broker: Broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica B runs two instances; replica A starts and lists both as running, then B
    cancels one before A gets to it. A arms the deadline of the one still running again
    (idempotent), and does nothing for the cancelled one: no step task, no deadline timer.
    The running one's step is not sent again either: it was routed, and a server killed -9
    forgets the ids of consumed messages, so a copy would run again (a chaos run)."""
    names = broker.names
    gate = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=FLOWS)) as replica_b,
        serving(broker, replica_b, holding(gate)),
        ReachClient(broker=broker) as client,
        Broker(broker.url, names=names, name="replica-a") as own,
    ):
        for instance in ("kept", "ended"):
            await client.publish("held", {"n": instance}, message_id=instance)
            await watcher.event("accepted", message_id=message_id_of(instance, "a", 1))

        async def cancelled_meanwhile() -> None:
            await cancel(broker, "ended")
            await watcher.event("workflow_cancelled", message_id="ended")

        bucket = await own.bucket(names.workflows_bucket, WorkflowRecord)
        stale = StaleSnapshot(bucket, cancelled_meanwhile)
        published: list[str] = []
        publish = own.publish

        async def recorded(subject: str, data: bytes, **options: Any) -> Any:
            published.append(subject)
            return await publish(subject, data, **options)

        async def records() -> Any:
            return stale

        replica_a = WorkflowEngine(own, FLOWS)
        monkeypatch.setattr(replica_a, "_records", records)
        monkeypatch.setattr(own, "publish", recorded)
        resumed = await replica_a.resume_all()
        gate.set()
    assert resumed == 1
    assert published == [names.workflow_timer("kept")]


async def test_a_step_is_not_refused_on_a_replica_behind_the_leader(
    broker: Broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct get answered by a replica behind (a node paused) showed no instance yet, and
    the step's task, still wanted, was refused as `cancelled`: a "not wanted" is confirmed
    with the stream's leader first."""
    gate = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, holding(gate)),
        ReachClient(broker=broker) as client,
    ):
        await client.publish("held", {"n": 1}, message_id="behind")
        step_id = message_id_of("behind", "a", 1)
        await watcher.event("accepted", message_id=step_id)
        read_from_a_replica_behind(broker, monkeypatch)
        step = Task(
            v=1,
            message_id=step_id,
            trace_id="behind",
            topic="hold-step",
            reply_to=broker.names.workflow_reply("behind"),
        )
        wanted = await still_wanted(broker, step)
        monkeypatch.undo()
        gate.set()
        await watcher.event("workflow_completed", message_id="behind")
    assert wanted is not None
    assert watcher.count("rejected") == 0


async def test_an_instance_a_replica_behind_lacks_is_unknown_only_once_the_leader_agrees(
    broker: Broker, start_coordinator, watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change read first from a replica behind (no instance yet) is read again from the
    leader: the instance is called unknown, in a warning, only when the leader lacks it."""
    gate = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=FLOWS)) as coordinator,
        serving(broker, coordinator, holding(gate)),
        ReachClient(broker=broker) as client,
    ):
        await client.publish("held", {"n": 1}, message_id="behind-2")
        await watcher.event("accepted", message_id=message_id_of("behind-2", "a", 1))
        engine = coordinator.workflows
        engine._hot._forget("behind-2")  # no copy of its own: the change reads the bucket
        read_from_a_replica_behind(broker, monkeypatch)
        with capture_logs() as logs:
            await engine._apply("behind-2", lambda run: False, False)
            await engine._apply("never-started", lambda run: False, False)
        monkeypatch.undo()
        gate.set()
        await watcher.event("workflow_completed", message_id="behind-2")
    unknown = [e["instance_id"] for e in logs if "unknown workflow instance" in e["event"]]
    assert unknown == ["never-started"]


async def test_actions_a_server_crash_cut_short_are_done_when_their_message_comes_as_new(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step `a`'s result was applied (the record says `b` runs), and the server died before
    `b`'s task went out. A server that dies so delivers `a`'s result again as new (its
    delivery count lost with the acknowledgement), which finds nothing left to change: `b`
    was never sent, and the instance waited for its deadline. The replica remembers the
    instance it owes, and does all its record calls for then."""
    monkeypatch.setattr(consumption, "RETRY_DELAY_S", 60.0)  # only the delivery as new comes
    async with Broker(broker.url, names=broker.names, name="coordinator") as own:
        coordinator = Coordinator(own, fast(workflows=PAIR))
        handle, results = coordinator.workflows.handle, list[Delivery]()

        async def keeping(msg: Delivery) -> float | None:
            if isinstance(envelopes.decode_reply(msg.data), envelopes.Result):
                results.append(msg)
            return await handle(msg)

        publish, cut_short = own.publish, asyncio.Event()

        async def dying(subject: str, data: bytes, **options: Any) -> Any:
            if subject == own.names.coordinator_task("second-step") and not cut_short.is_set():
                cut_short.set()
                raise BrokerError("the server went away")
            return await publish(subject, data, **options)

        coordinator.workflows.handle = keeping  # type: ignore[method-assign]
        monkeypatch.setattr(own, "publish", dying)
        async with (
            coordinator.running(),
            serving(broker, coordinator, echoing("echo", "first-step", "second-step")),
            ReachClient(broker=broker) as client,
        ):
            invoked = asyncio.create_task(client.invoke("pair", {"n": 1}, message_id="cut"))
            await asyncio.wait_for(cut_short.wait(), 10)
            [first] = results
            assert await handle(delivered_again_as_new(first)) is None
            assert await asyncio.wait_for(invoked, 10) == {"n": 1}
