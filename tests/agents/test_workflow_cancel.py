"""ReachClient.cancel_workflow on a real server: a caller cancels a workflow it started and
hears how it ended; another caller's instance, or no instance, is refused by name."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from agentreach.agents import (
    Agent,
    ReachClient,
    TaskContext,
    TaskFailed,
    UnknownWorkflow,
    WorkflowEnded,
)
from agentreach.broker import Broker
from agentreach.coordinator import Coordinator
from agentreach.coordinator import workflow as wf
from agentreach.envelopes import new_id
from tests.conftest import FAST
from tests.support import eventually

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
        with pytest.raises(UnknownWorkflow, match="'nothing-1' among alice"):
            await alice.cancel_workflow("nothing-1")
        assert not invoked.done()
        await alice.cancel_workflow(instance)
        with pytest.raises(TaskFailed):
            await invoked
