"""A workflow's definition changed (or removed) while instances of it run: each instance goes
on by the definition it started with, on a real server, so no step runs twice under a new
name and none is left waiting; new instances take the configured one."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker
from agentreach.coordinator import load_config
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import read_record
from agentreach.coordinator.workflows.actions import message_id_of
from agentreach.coordinator.workflows.deadline import new_record
from agentreach.coordinator.workflows.definitions import Definitions, as_stored, fingerprint
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import Result, Task, decode_reply, encode, headers
from tests.e2e.routing_support import fast
from tests.support import until_true

FIRST = {"order": wf.chain(wf.step("reserve", "reserve"), wf.step("charge", "charge"))}
# The step that charges renamed, and a step added after it.
RENAMED = {
    "order": wf.chain(
        wf.step("reserve", "reserve"), wf.step("pay", "charge"), wf.step("ship", "ship")
    )
}
SHOP = Path(__file__).parents[3] / "deploy" / "coordinator" / "coordinator.yaml"


def shop(runs: Counter[str], charging: asyncio.Event) -> Agent:
    """Reserves and ships at once; charges when ``charging`` is set; counts each run."""
    agent = Agent("shop", startup_delay=0)

    async def reserve(ctx: TaskContext, payload: Any) -> Any:
        runs["reserve"] += 1
        return payload

    async def charge(ctx: TaskContext, payload: Any) -> Any:
        runs["charge"] += 1
        await charging.wait()
        return payload

    async def ship(ctx: TaskContext, payload: Any) -> Any:
        runs["ship"] += 1
        return payload

    for topic, handle in (("reserve", reserve), ("charge", charge), ("ship", ship)):
        agent.handler(topic, capacity=4)(handle)
    return agent


async def _held_at_charge(
    broker: Broker, start_coordinator, watcher, runs: Counter[str], charging: asyncio.Event
) -> None:
    """Instance ``o1`` of the first definition, its charge step running at the agent."""
    async with (
        start_coordinator(fast(workflows=FIRST)),
        ReachClient(broker=broker) as client,
    ):
        await client.publish("order", {"sku": "a"}, message_id="o1", ttl_ms=60_000)
        await watcher.event("accepted", message_id=message_id_of("o1", "charge", 1))
    assert runs["charge"] == 1


async def test_an_instance_goes_on_by_its_own_definition_after_a_step_was_renamed(
    broker: Broker, start_coordinator, watcher
) -> None:
    """The coordinator restarts with `charge` renamed `pay` and a `ship` step added: the
    running instance completes `charge` and ends (charged once, never shipped, no `pay`);
    an instance started now runs the new definition."""
    runs: Counter[str] = Counter()
    charging = asyncio.Event()
    async with shop(runs, charging).running(broker=broker):
        await _held_at_charge(broker, start_coordinator, watcher, runs, charging)
        with capture_logs() as logs:
            async with (
                start_coordinator(fast(workflows=RENAMED)) as coordinator,
                ReachClient(broker=broker) as client,
            ):
                charging.set()
                await watcher.event("workflow_completed", message_id="o1")
                assert await client.invoke("order", {"sku": "b"}, message_id="o2") == {"sku": "b"}
    assert runs == {"reserve": 2, "charge": 2, "ship": 1}  # o1: reserve, charge; o2: all three
    first, second = [await read_record(broker, i) for i in ("o1", "o2")]
    assert first is not None and second is not None
    assert list(first.steps) == ["reserve", "charge"] and first.steps_total == 2
    assert list(second.steps) == ["reserve", "pay", "ship"]
    assert first.definition_id == fingerprint(FIRST["order"])
    assert second.definition_id == fingerprint(RENAMED["order"]) != first.definition_id
    assert coordinator.workflows.specs["order"] == RENAMED["order"]
    said = [e for e in logs if e.get("definition_id") == first.definition_id]
    assert said and said[0]["configured"] == fingerprint(RENAMED["order"])


async def test_an_instance_of_a_workflow_no_longer_defined_still_ends(
    broker: Broker, start_coordinator, watcher
) -> None:
    """The coordinator restarts with no workflow configured at all: it still resumes the
    running instance, which ends when its step's result comes; its starting task sent again
    (past the stream's duplicate window) is answered with how it ended, not refused as a
    topic no agent serves ("nothing ran": a sender would then run it again)."""
    runs: Counter[str] = Counter()
    charging = asyncio.Event()
    async with shop(runs, charging).running(broker=broker):
        await _held_at_charge(broker, start_coordinator, watcher, runs, charging)
        with capture_logs() as logs:
            async with (
                start_coordinator(fast(workflows={})) as coordinator,
            ):
                charging.set()
                await watcher.event("workflow_completed", message_id="o1")
                started = await read_record(broker, "o1")
                assert started is not None and started.task.caller is not None
                again = await _sent_again(broker, started.task.caller, started.task)
    assert isinstance(again, Result) and again.result == {"sku": "a"}
    assert runs == {"reserve": 1, "charge": 1}
    assert "order" not in coordinator.workflows.specs
    assert [e["count"] for e in logs if e["event"] == "unfinished workflows resumed"] == [1]
    assert not [e for e in watcher.events if e.event == "dead_lettered"]


async def _sent_again(broker: Broker, caller: str, task: Task) -> object:
    """The answer to ``task`` sent again by ``caller`` once the intake's duplicate window
    has passed since the first (as a day later: no Nats-Msg-Id the stream still holds)."""
    heard: asyncio.Queue[bytes] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await heard.put(msg.data)

    box = broker.names.reply_box(caller, "again")
    replies = await broker.nc.subscribe(f"{box}.*", cb=keep)
    task = msgspec.structs.replace(task, reply_to=box)
    sent = {k: v for k, v in headers.task_headers(task).items() if k != headers.MSG_ID}
    await broker.publish(broker.names.task(task.topic, caller), encode(task), headers=sent)
    try:
        return decode_reply(await asyncio.wait_for(heard.get(), timeout=10))
    finally:
        await replies.unsubscribe()


def test_every_shipped_definition_reads_back_as_itself_from_a_record() -> None:
    """What a record keeps turns back into the same definition, with the same fingerprint
    (the deploy example's workflows: chains, fan-outs, state machines, undo steps)."""
    specs = load_config(SHOP).workflows
    assert specs
    for name, spec in specs.items():
        stored = msgspec.json.decode(msgspec.json.encode(as_stored(spec)))
        again = msgspec.convert(stored, WorkflowSpec)
        assert again == spec, name
        assert fingerprint(again) == fingerprint(spec), name


def test_records_from_before_definitions_were_kept_use_the_configured_one() -> None:
    """A record without a definition is read by the configured one (as before); one whose
    kept definition no longer reads is left as is (said in the log), never run by another."""
    definitions = Definitions(FIRST)
    started = new_record(
        "order", Task(v=1, message_id="x", trace_id="t", topic="order"), FIRST["order"], 0
    )
    record = msgspec.structs.replace(started, definition_id="", definition=None)
    assert record.definition_id == "" and definitions.of(record) is FIRST["order"]
    unreadable = msgspec.structs.replace(record, definition_id="f" * 16, definition={"x": 1})
    assert definitions.of(unreadable) is None


# An order charges, then ships through a child workflow, which labels through its own child.
NESTED = {
    "order": wf.chain(wf.step("charge", "charge"), wf.step("shipping", "shipping")),
    "shipping": wf.chain(wf.step("reserve", "reserve"), wf.step("labels", "labels")),
    "labels": wf.chain(wf.step("ship", "ship")),
}


async def test_a_running_instance_still_starts_children_no_longer_defined(
    broker: Broker, start_coordinator, watcher
) -> None:
    """The coordinator restarts with the child workflows removed while an order waits at
    its charge: the order still runs `shipping` (and `shipping` its own child `labels`) by
    the definitions in force when the order started, so it completes, each step once; it
    was failed `no_route` (nothing serves `shipping`) and its charge undone."""
    runs: Counter[str] = Counter()
    charging = asyncio.Event()
    async with shop(runs, charging).running(broker=broker):
        async with (
            start_coordinator(fast(workflows=NESTED)),
            ReachClient(broker=broker) as client,
        ):
            await client.publish("order", {"sku": "a"}, message_id="o1", ttl_ms=60_000)
            await watcher.event("accepted", message_id=message_id_of("o1", "charge", 1))
        async with start_coordinator(fast(workflows={"order": NESTED["order"]})):
            charging.set()
            await watcher.event("workflow_completed", message_id="o1")
    assert runs == {"charge": 1, "reserve": 1, "ship": 1}
    child = await read_record(broker, message_id_of("o1", "shipping", 1))
    assert child is not None and child.workflow == "shipping" and child.status == "completed"
    assert child.definition_id == fingerprint(NESTED["shipping"])
    grandchild = await read_record(broker, message_id_of(child.instance_id, "labels", 1))
    assert grandchild is not None and grandchild.definition_id == fingerprint(NESTED["labels"])
    assert not [e for e in watcher.events if e.event in ("dead_lettered", "workflow_failed")]


def test_a_record_keeps_its_children_and_theirs_and_older_records_take_the_configured() -> None:
    """`calls` holds every workflow below the one started (not the agents' intents); a
    record written before it kept them (`calls` null) takes the configured workflows; a
    workflow no longer configured becomes known as retired once any record names it."""
    definitions = Definitions(NESTED)
    assert set(definitions.calls_of("order")) == {"shipping", "labels"}
    assert definitions.calls_of("labels") == {}
    task = Task(v=1, message_id="x", trace_id="t", topic="order")
    record = new_record("order", task, NESTED["order"], 0, definitions.calls_of("order"))
    older = msgspec.structs.replace(record, calls=None)
    now = Definitions({"order": NESTED["order"]})
    assert set(now.children(record)) == {"shipping", "labels"}
    assert set(now.children(older)) == {"order"}
    assert now.child_of(record, "shipping") == NESTED["shipping"]
    assert now.child_of(older, "shipping") is None and now.child_of(record, "order") is None
    assert now.retired == set()
    now.of(record)
    assert now.retired == {"shipping", "labels"}


async def test_a_workflow_one_replica_has_and_another_not_yet_is_left_to_the_first(
    broker: Broker, start_coordinator, watcher
) -> None:
    """A rolling restart: one replica runs with a new workflow, the other still on the
    configuration before. Every task for it is started by the replica that has it (the
    other lets it come back for that one to take), none dead-lettered `no_route` (a third
    of them were, in an SRE's walkthrough)."""
    runs: Counter[str] = Counter()
    charging = asyncio.Event()
    charging.set()
    async with (
        shop(runs, charging).running(broker=broker),
        start_coordinator(fast(workflows=FIRST)) as new,
        start_coordinator(fast(workflows={})) as old,
        ReachClient(broker=broker) as client,
    ):
        await old._sampled.sample()  # what the status answers say, at once (every 5 s)
        assert "order" in old._sampled.workflows_elsewhere
        sent = [await client.publish("order", {"n": n}) for n in range(12)]
        for message_id, _ in sent:
            await watcher.event("workflow_completed", message_id=message_id)
    assert runs == {"reserve": 12, "charge": 12}
    assert watcher.dead_letters == [] and "order" not in old.workflows.specs
    assert "order" in new.workflows.specs


async def test_a_replica_started_later_with_a_workflow_is_read_by_the_others_within_seconds(
    broker: Broker, start_coordinator
) -> None:
    """The replicas read each other's status every second or so (streams every 5 s): the
    others dead-lettered a new replica's workflow `no_route` for up to 5 s after it was
    ready (a trial: 6 tasks)."""
    async with start_coordinator(fast(workflows={})) as old:
        assert "order" not in old._sampled.workflows_elsewhere
        async with start_coordinator(fast(workflows=FIRST)):

            async def read() -> bool:
                return "order" in old._sampled.workflows_elsewhere

            await until_true(read, timeout=3.5, every_s=0.05)
