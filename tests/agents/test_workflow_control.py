"""ReachClient.cancel_workflow and signal_workflow on a real server: a caller cancels a
workflow it started and hears how it ended, signals one and hears whether its state took the
event; another caller's instance, or no instance, is refused by name."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from nats.js.errors import NotFoundError

from agentreach.agents import (
    Agent,
    DeadlineExceeded,
    InvalidArgument,
    ReachClient,
    SignalOutcome,
    TaskContext,
    TaskFailed,
    UnknownWorkflow,
    WorkflowActionRefused,
    WorkflowEnded,
    workflow_control,
)
from agentreach.broker import Broker, BrokerTimeout
from agentreach.coordinator import Coordinator, RateLimits
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import control as wf_control
from agentreach.envelopes import RateLimit, new_id
from tests.conftest import FAST
from tests.e2e.test_workflows import APPROVAL, _until_record, approval_checker, workflows
from tests.support import eventually, until_true

HELD = "held-chain"


@contextlib.asynccontextmanager
async def held_workflow(broker: Broker) -> AsyncIterator[asyncio.Queue[Any]]:
    """A coordinator serving ``held-chain``, whose one step an agent holds until the test
    ends; yields the queue of payloads the step got."""
    held: asyncio.Queue[Any] = asyncio.Queue()
    release = asyncio.Event()
    config = msgspec.structs.replace(FAST, workflows={HELD: wf.chain(wf.step("a", "hold"))})
    agent = Agent("cancel-holder", startup_delay=0)

    @agent.handler("hold")
    async def hold(ctx: TaskContext, payload: Any) -> Any:
        await held.put(payload)
        await release.wait()
        return payload

    async with (
        Broker(broker.url, names=broker.names, name="coordinator") as own,
        Coordinator(own, config).running() as coordinator,
        agent.running(broker=broker),
    ):
        await eventually(lambda: "cancel-holder" in coordinator.directory.cards)
        try:
            yield held
        finally:
            release.set()


async def test_a_caller_cancels_its_workflow_and_hears_how_it_ended(broker):
    async with held_workflow(broker) as held, ReachClient(broker=broker, name="alice") as alice:
        instance = new_id()
        invoked = asyncio.create_task(alice.invoke(HELD, {"n": 1}, message_id=instance))
        assert await asyncio.wait_for(held.get(), 10) == {"n": 1}

        ended = await alice.cancel_workflow(instance, why="changed my mind")
        assert ended == WorkflowEnded(instance, "cancelled", ended.at_ms, before_cancel=False)
        with pytest.raises(TaskFailed) as stopped:
            await asyncio.wait_for(invoked, 10)
        assert stopped.value.ending == "cancelled"
        assert stopped.value.error.message == "cancelled by its caller 'alice': changed my mind"

        again = await alice.cancel_workflow(instance)
        assert (again.status, again.before_cancel, again.at_ms) == ("cancelled", True, ended.at_ms)


async def test_another_caller_s_instance_or_none_is_refused_by_name(broker):
    async with (
        held_workflow(broker) as held,
        ReachClient(broker=broker, name="alice") as alice,
        ReachClient(broker=broker, name="bob") as bob,
    ):
        instance = new_id()
        invoked = asyncio.create_task(alice.invoke(HELD, {}, message_id=instance))
        await asyncio.wait_for(held.get(), 10)
        with pytest.raises(UnknownWorkflow, match=f"no workflow instance '{instance}' among bob"):
            await bob.cancel_workflow(instance)
        with pytest.raises(UnknownWorkflow, match="'nothing-1' among alice") as unknown:
            await alice.cancel_workflow("nothing-1")
        # No event at all: it may be one whose start still waits in the intake.
        assert "still waits in the intake" in str(unknown.value)
        assert not invoked.done()
        await alice.cancel_workflow(instance)
        with pytest.raises(TaskFailed):
            await invoked


@contextlib.asynccontextmanager
async def approval_served(broker: Broker, **config: Any) -> AsyncIterator[None]:
    """A coordinator running the ``approval`` state machine (``config``: more settings),
    and an agent for its check."""
    config = msgspec.structs.replace(FAST, workflows=workflows(approval=APPROVAL), **config)
    async with (
        approval_checker().running(broker=broker),  # first: a task waiting in the intake finds it
        Broker(broker.url, names=broker.names, name="coordinator") as own,
        Coordinator(own, config).running() as coordinator,
    ):
        await eventually(lambda: "checker" in coordinator.directory.cards)
        yield


@contextlib.asynccontextmanager
async def approval_waiting(
    broker: Broker, caller: ReachClient, **config: Any
) -> AsyncIterator[tuple[str, Any]]:
    """An ``approval`` instance ``caller`` started, its state ``submitted`` waiting for
    ``approve`` or ``reject``: (its id, the caller's invoke)."""
    async with approval_served(broker, **config):
        instance = new_id()
        invoked = asyncio.create_task(caller.invoke("approval", {}, message_id=instance))
        await _until_record(broker, instance, lambda r: r.steps["submitted"].status == "completed")
        try:
            yield instance, invoked
        finally:
            invoked.cancel()


async def test_a_caller_signals_at_once_after_its_publish(broker, monkeypatch):
    """Signalled right after its publish, an instance not started yet (its task still in
    the intake) was UnknownWorkflow (a fresh reader: 8 of 10): it is waited for a moment.
    Here the coordinator starts only once the signal is on its way (a longer moment)."""
    monkeypatch.setattr(workflow_control, "START_GRACE_S", 20.0)
    async with ReachClient(broker=broker, name="alice") as alice:
        instance, _ = await alice.publish("approval", {})  # no coordinator yet: in the intake
        signalling = asyncio.create_task(alice.signal_workflow(instance, "approve", wait_s=20))
        async with approval_served(broker):
            outcome = await signalling
    assert outcome.taken and outcome.state == "submitted"


async def test_a_caller_signals_its_workflow_and_hears_whether_it_was_taken(broker):
    """An event the state does not take is said with those it takes; one it takes moves the
    machine (the starter gets its end); once ended, nothing is sent and the end is said."""
    async with (
        ReachClient(broker=broker, name="alice") as alice,
        approval_waiting(broker, alice) as (instance, invoked),
    ):
        ignored = await alice.signal_workflow(instance, "nope")
        taken = await alice.signal_workflow(instance, "approve")
        assert await asyncio.wait_for(invoked, 10) == {"ok": True}
        after = await alice.signal_workflow(instance, "reject")
        events = await alice.status(instance)
    assert ignored == SignalOutcome(
        instance, "nope", taken=False, state="submitted", waits_for=("approve", "reject")
    )
    assert taken == SignalOutcome(instance, "approve", taken=True, state="submitted")
    assert after == SignalOutcome(instance, "reject", taken=False, ended="completed")
    [said] = [e for e in events if e.event == "signal_taken"]
    assert said.detail["by"] == "alice"  # who moved it, in the starter's own trace


async def test_a_caller_over_its_quota_hears_its_signal_and_cancel_were_not_acted_on(broker):
    """Signals and cancels are charged to a caller's quota as its tasks are (a signal may
    move a machine on to a step no quota saw): over it, neither is acted on, and the caller
    hears why and when to send again. An operator's signal is not charged."""
    quota = RateLimits(callers={"alice": RateLimit(rate=0.05, burst=2)})  # the start, a signal
    async with (
        ReachClient(broker=broker, name="alice") as alice,
        approval_waiting(broker, alice, rate_limits=quota) as (instance, invoked),
    ):
        ignored = await alice.signal_workflow(instance, "nope")  # the second token
        with pytest.raises(WorkflowActionRefused) as signal_refused:
            await alice.signal_workflow(instance, "approve")
        with pytest.raises(WorkflowActionRefused) as cancel_refused:
            await alice.cancel_workflow(instance)
        record = await _until_record(broker, instance, lambda r: True)
        assert (record.status, record.current) == ("running", "submitted")  # neither acted

        await wf_control.signal(broker, instance, "approve")  # an operator's, on the bare form
        assert await asyncio.wait_for(invoked, 10) == {"ok": True}
        events = await alice.status(instance)
    assert ignored == SignalOutcome(
        instance, "nope", taken=False, state="submitted", waits_for=("approve", "reject")
    )
    for refused, what in ((signal_refused, "signal approve"), (cancel_refused, "cancel")):
        error = refused.value.error
        assert (error.type, error.retryable, refused.value.instance_id) == (
            "rate_limited",
            True,
            instance,
        )
        assert 0 < (error.retry_after_ms or 0) <= 20_000
        assert str(refused.value).startswith(f"workflow {instance!r}: {what} not acted on:")
        assert "over its quota 'alice' (0.05/s, burst 2)" in str(refused.value)
    [cancel_said] = [e for e in events if e.event == "cancel_refused"]
    assert cancel_said.detail["by"] == "alice" and cancel_said.detail["workflow"] == "approval"
    [taken] = [e for e in events if e.event == "signal_taken"]
    assert "by" not in taken.detail  # the operator's


STEPS = """
states:
  initial: first
  states:
    first: {next: [{event: go, to: second}]}
    second: {next: [{event: go, to: done}]}
    done: {terminal: true, input: {went: 2}}
"""


async def test_every_signal_a_state_takes_is_said_not_only_the_first(broker):
    """Two signals taken by one instance, each by a state of its own: the second's
    `signal_taken` had the first's Nats-Msg-Id, was dropped, and the caller heard
    DeadlineExceeded for a signal that had moved the machine (sent again, it would move it
    once more)."""
    config = msgspec.structs.replace(FAST, workflows=workflows(steps=STEPS))
    async with (
        Broker(broker.url, names=broker.names, name="coordinator") as own,
        Coordinator(own, config).running(),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        instance = new_id()
        invoked = asyncio.create_task(alice.invoke("steps", {}, message_id=instance))
        await _until_record(broker, instance, lambda r: r.current == "first")
        first = await alice.signal_workflow(instance, "go", wait_s=5)
        second = await alice.signal_workflow(instance, "go", wait_s=5)
        assert await asyncio.wait_for(invoked, 10) == {"went": 2}
        events = await alice.status(instance)
    assert (first.taken, first.state, second.taken, second.state) == (True, "first", True, "second")
    taken = [(e.detail["state"], e.detail["visit"]) for e in events if e.event == "signal_taken"]
    assert taken == [("first", 1), ("second", 1)]


async def test_two_signals_of_one_event_sent_at_once_each_hear_their_own_answer(broker):
    """`approve` sent twice at once: the state takes one, the instance then ends and the
    other is ignored. Both said `taken` (answers were matched on the event and the time);
    each now hears the answer that names its own signal."""
    async with (
        ReachClient(broker=broker, name="alice") as alice,
        approval_waiting(broker, alice) as (instance, invoked),
    ):
        answers = await asyncio.gather(
            alice.signal_workflow(instance, "approve", wait_s=5),
            alice.signal_workflow(instance, "approve", wait_s=5),
        )
        assert await asyncio.wait_for(invoked, 10) == {"ok": True}
    assert sorted(answer.taken for answer in answers) == [False, True]


async def test_a_signal_waits_out_a_coordinator_that_does_not_answer_for_a_moment(
    broker, monkeypatch
):
    """The events read while waiting for the answer time out (a leader election, a
    coordinator restarting): read again until the wait ends, not raised as a BrokerTimeout."""
    async with (
        ReachClient(broker=broker, name="alice") as alice,
        approval_waiting(broker, alice) as (instance, _),
    ):
        reads, status = [], alice.status

        async def unanswered_once(message_id: str) -> list[Any]:
            reads.append(message_id)
            if len(reads) == 2:  # the first read after the signal was sent
                raise BrokerTimeout("timed out on '$JS.API.STREAM.INFO.REACH_EVENTS'")
            return await status(message_id)

        monkeypatch.setattr(alice, "status", unanswered_once)
        taken = await alice.signal_workflow(instance, "approve")
    assert taken == SignalOutcome(instance, "approve", taken=True, state="submitted")
    assert len(reads) >= 3


async def test_another_caller_s_signal_is_refused_and_bad_events_are_named(broker):
    """bob may not signal alice's instance: the SDK says so, and bob's signal sent by hand is
    settled without moving it; an event that is no subject token is refused before sending."""
    async with (
        ReachClient(broker=broker, name="alice") as alice,
        ReachClient(broker=broker, name="bob") as bob,
        approval_waiting(broker, alice) as (instance, invoked),
    ):
        with pytest.raises(UnknownWorkflow, match=f"'{instance}' among bob's own"):
            await bob.signal_workflow(instance, "approve")
        with pytest.raises(InvalidArgument, match=r"event='a\.b': an event is one subject token"):
            await alice.signal_workflow(instance, "a.b")
        subject = f"{bob.broker.names.workflow_signal(instance, 'approve')}.bob"
        sent = await bob.broker.publish(subject, b"")
        await until_true(lambda: _handled(broker, sent.seq))
        record = await _until_record(broker, instance, lambda r: True)
        assert record.current == "submitted" and record.status == "running"
        assert not invoked.done()
        with pytest.raises(DeadlineExceeded, match="nope signalled; the coordinator has not said"):
            await alice.signal_workflow(instance, "nope", wait_s=0)
        assert (await alice.signal_workflow(instance, "reject")).taken


async def _handled(broker: Broker, seq: int) -> bool:
    """Whether the coordinator acknowledged REACH_WORKFLOWS message ``seq`` (a work queue: an
    acknowledged message is gone)."""
    try:
        await broker.js.get_msg(broker.names.workflows_stream, seq)
    except NotFoundError:
        return True
    return False
