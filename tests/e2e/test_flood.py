"""One caller's flood through a real server: refused at its publish past its own backlog on
the intake (``StorageLimits.tasks_per_subject``), so another caller's task stands behind
no more than that; nothing taken in is lost, and every refused publish is told so."""

from __future__ import annotations

from collections import Counter

from agentreach import envelopes
from agentreach.broker import Broker, Topology, provision
from agentreach.broker.errors import SUBJECT_FULL, SubjectFull
from agentreach.broker.limits import StorageLimits
from agentreach.broker.pipelined import Outgoing
from agentreach.broker.streams import subject_counts
from agentreach.envelopes import Task, new_id
from agentreach.envelopes.headers import task_headers
from tests.e2e.routing_support import fast, worker
from tests.support import Watcher, until_true

BOUND = 20
FLOOD = 50


def task_of(broker: Broker, caller: str) -> tuple[Task, Outgoing]:
    """A task on topic ``work`` and its message on ``caller``'s intake subject."""
    message_id = new_id()
    task = Task(v=1, message_id=message_id, trace_id=message_id, topic="work")
    subject = broker.names.task("work", caller)
    return task, Outgoing(subject, envelopes.encode(task), task_headers(task))


async def flooder_backlog_empty(broker: Broker) -> bool:
    subject = broker.names.task("work", "flooder")
    return not await subject_counts(broker, broker.names.tasks_stream, subject)


def routed_order(watcher: Watcher, ids: set[str]) -> list[str]:
    return [e.message_id for e in watcher.events if e.event == "routed" and e.message_id in ids]


async def test_a_flood_is_refused_at_publish_past_its_backlog(broker, start_coordinator, watcher):
    """With no coordinator taking tasks, a caller's 50 publishes on one topic store 20 (the
    bound) and the other 30 raise SubjectFull; another caller's task is stored beside them.
    Once a coordinator runs, every stored task completes, the other caller's after at most
    the flood's 20, and nothing is dead-lettered."""
    limits = StorageLimits(tasks_per_subject=BOUND)
    await provision(broker, Topology.default(broker.names, limits=limits))
    flood = [task_of(broker, "flooder") for _ in range(FLOOD)]
    outcomes = await broker.publish_all([message for _, message in flood])
    refused = [e for e in outcomes if e is not None]
    assert outcomes[:BOUND] == [None] * BOUND  # in order: the first ones fill the backlog
    assert len(refused) == FLOOD - BOUND
    assert all(isinstance(e, SubjectFull) and e.err_code == SUBJECT_FULL for e in refused)
    bob, message = task_of(broker, "bob")
    assert await broker.publish_all([message]) == [None]
    stored = {task.message_id for (task, _), e in zip(flood, outcomes, strict=True) if e is None}
    counts: Counter[str] = Counter()
    # The agent first: the backlog is taken in as soon as the coordinator runs.
    async with (
        worker("w", counts).running(broker=broker),
        start_coordinator(fast(limits=limits)),
    ):
        everyone = stored | {bob.message_id}
        await watcher.until(lambda: watcher.ids_with("completed", everyone) == everyone, "all")
    order = routed_order(watcher, everyone)
    assert order.index(bob.message_id) <= BOUND
    assert counts["w"] == BOUND + 1
    assert watcher.count("dead_lettered") == 0 and watcher.dead_letters == []


async def test_the_backlog_bound_is_per_caller_and_comes_back(broker, start_coordinator, watcher):
    """A caller whose backlog is full is refused while another caller's publish on the same
    topic is stored; once the coordinator has taken the backlog, the first caller's next
    publish is stored again."""
    limits = StorageLimits(tasks_per_subject=BOUND)
    await provision(broker, Topology.default(broker.names, limits=limits))
    full = await broker.publish_all([task_of(broker, "flooder")[1] for _ in range(BOUND + 1)])
    assert full[:BOUND] == [None] * BOUND and isinstance(full[BOUND], SubjectFull)
    others = await broker.publish_all([task_of(broker, f"caller{i}")[1] for i in range(3)])
    assert others == [None, None, None]
    counts: Counter[str] = Counter()
    # The agent first: the backlog is taken in as soon as the coordinator runs.
    async with (
        worker("w", counts).running(broker=broker),
        start_coordinator(fast(limits=limits)),
    ):
        await watcher.until(lambda: watcher.count("completed") == BOUND + 3, "the backlog")
        # An ack is not awaited: a task can complete before the server has taken its ack.
        await until_true(lambda: flooder_backlog_empty(broker))
        again, message = task_of(broker, "flooder")
        assert await broker.publish_all([message]) == [None]
        await watcher.event("completed", message_id=again.message_id)
    assert counts["w"] == BOUND + 4
