"""ReachClient's public calls: what they take, and what a wrong argument or a missing
coordinator makes them say."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from typing import Any

import pytest
from structlog.testing import capture_logs

import agentreach
from agentreach.agents import (
    Agent,
    NotAcknowledged,
    ReachClient,
    Rejected,
    TaskContext,
    TaskFailed,
)
from agentreach.agents.coordinator_presence import coordinator_runs
from agentreach.broker import Broker, BrokerError
from agentreach.envelopes import MAX_TTL_MS, Budget
from tests.e2e.routing_support import fast, serving, table, worker
from tests.support import eventually, until_true

TIERS = """
rules:
  - name: gold
    match: {topic: work, where: [{field: header.X-Tier, op: "==", value: gold}]}
    to: {tags: "tier=gold"}
  - {name: rest, fallback: true, to: {tags: "tier=plain"}}
"""


async def test_invoke_sends_headers_that_routing_rules_match(broker, start_coordinator):
    """invoke(headers=...) puts them on the task, so a header.<Name> rule routes it."""
    counts: Counter[str] = Counter()
    fleet = [worker(f"{tier}-1", counts, tags={"tier": tier}) for tier in ("gold", "plain")]
    async with (
        start_coordinator(fast(routing=table(TIERS))) as coordinator,
        serving(broker, coordinator, *fleet),
        ReachClient(broker=broker) as client,
    ):
        gold = await client.invoke("work", {}, headers={"X-Tier": "gold"})
        plain = await client.invoke("work", {})
    assert (gold, plain) == ({"by": "gold-1"}, {"by": "plain-1"})


def test_publish_names_the_options_of_task():
    """publish() takes task()'s options by name, with the same defaults and types: no
    ``**options`` that hides them from editors and type checkers."""
    task = inspect.signature(ReachClient.task).parameters
    publish = inspect.signature(ReachClient.publish).parameters
    assert not [p for p in publish.values() if p.kind is p.VAR_KEYWORD]
    assert [(p.name, p.kind, p.default, p.annotation) for p in publish.values()] == [
        (p.name, p.kind, p.default, p.annotation) for p in task.values()
    ]


def test_invoke_takes_every_option_of_task_it_does_not_set_itself():
    """invoke() takes all of task()'s options but reply_to (its own box) and budget (its
    ack_deadline_ms and execute_deadline_ms)."""
    task = set(inspect.signature(ReachClient.task).parameters) - {"reply_to", "budget"}
    invoke = set(inspect.signature(ReachClient.invoke).parameters)
    assert task <= invoke, sorted(task - invoke)


class Opaque:
    """Something JSON has no form for."""


# (call, its keyword arguments, the argument the error must name)
WRONG = [
    ("invoke", {"ttl_ms": 0}, "ttl_ms=0"),
    ("invoke", {"ack_deadline_ms": 0}, "ack_deadline_ms=0"),
    ("invoke", {"execute_deadline_ms": -1}, "execute_deadline_ms=-1"),
    ("invoke", {"ack_deadline_ms": "2000"}, "ack_deadline_ms='2000'"),
    ("invoke", {"message_id": ""}, "message_id=''"),
    ("invoke", {"trace_id": "a.b"}, "trace_id='a.b': use 1-128 letters"),
    ("invoke", {"priority": "P9"}, "priority='P9'"),
    ("invoke", {"headers": {"X-Tier": 1}}, "headers="),
    ("invoke", {"ttl_ms": MAX_TTL_MS + 1}, "ttl_ms=86400001"),
    ("publish", {"ttl_ms": 0}, "ttl_ms=0"),
    ("publish", {"message_id": "has space"}, "message_id='has space'"),
    ("publish", {"budget": Budget(ack_ms=0)}, "budget.ack_ms=0"),
    ("publish", {"reply_to": "$JS.API.x"}, "reply_to='$JS.API.x'"),
]


@pytest.mark.parametrize(("call", "options", "named"), WRONG, ids=[w[2] for w in WRONG])
async def test_a_wrong_argument_raises_invalid_argument_naming_it(broker, call, options, named):
    """A wrong argument raises InvalidArgument (a ValueError, exported from agentreach) that
    names the argument as the caller wrote it, not an envelope path; nothing is sent."""
    async with ReachClient(broker=broker) as client:
        send = getattr(client, call)
        extra: dict[str, Any] = {"ack_deadline_ms": 100} if call == "invoke" else {}
        with pytest.raises(agentreach.InvalidArgument) as caught:
            await send("work", {}, **{**extra, **options})
    assert str(caught.value).startswith(named), str(caught.value)
    assert "$." not in str(caught.value)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, agentreach.ReachError)


async def test_a_wrong_topic_is_named(broker):
    """A topic that cannot be a subject token is named, with what a topic may hold."""
    async with ReachClient(broker=broker) as client:
        with pytest.raises(agentreach.InvalidArgument, match=r"^topic='a\.b': use 1-128"):
            await client.publish("a.b", {})


@pytest.mark.parametrize("payload", [Opaque(), {"nested": [1, Opaque()]}, {(1, 2): "tuple key"}])
async def test_a_payload_json_cannot_hold_is_named(broker, payload):
    """A payload that cannot be encoded as JSON raises InvalidArgument naming the payload
    and what could not be encoded, not msgspec's bare TypeError."""
    async with ReachClient(broker=broker) as client:
        with pytest.raises(agentreach.InvalidArgument, match=r"^payload of 'work'") as caught:
            await client.publish("work", payload)
    assert caught.value.argument == "payload"


def test_task_checks_its_arguments_too():
    """task() (no connection needed) raises the same InvalidArgument as publish()."""
    client = ReachClient("nats://127.0.0.1:47999")
    with pytest.raises(agentreach.InvalidArgument, match=r"^ttl_ms=0") as caught:
        client.task("work", {}, ttl_ms=0)
    assert caught.value.argument == "ttl_ms"


async def test_invoke_with_a_day_to_run_keeps_its_ttl_within_a_day(broker, coordinator):
    """execute_deadline_ms of a day is accepted: the default ttl (both deadlines together)
    is capped at the longest a task may live, a day."""
    agent = Agent("patient-1", startup_delay=0)

    @agent.handler("work")
    async def work(ctx: TaskContext, payload: dict) -> int:
        return ctx.envelope.ttl_ms

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        ttl_ms = await client.invoke("work", {}, execute_deadline_ms=MAX_TTL_MS)
    assert MAX_TTL_MS - 60_000 < ttl_ms <= MAX_TTL_MS  # what is left of it when it ran


async def test_not_acknowledged_says_when_no_coordinator_runs(broker):
    """With the streams provisioned but no coordinator, NotAcknowledged says that nothing
    routes the task and how to start a coordinator, not only that no agent answered."""
    async with ReachClient(broker=broker) as client:
        with pytest.raises(NotAcknowledged) as caught:
            await client.invoke("work", {}, ack_deadline_ms=300)
    assert str(caught.value) == (
        "no agent acknowledged 'work' within 300 ms: no coordinator is running"
        " (none answered for 3 s; start one: reach up / reach coordinator); it stays queued"
        " and may still run within its ttl: invoke again with"
        f" message_id={caught.value.message_id!r} to hear how it ends"
    )


async def test_not_acknowledged_says_when_the_coordinator_does_not_answer(broker):
    """A coordinator stopped (SIGSTOP) or overloaded still listens, and answers nothing: the
    caller was told no agent serving the task may take work, blaming the agents (a trial)."""
    silent = await broker.nc.subscribe(broker.names.status)  # listens, never answers
    try:
        async with ReachClient(broker=broker) as client:
            with pytest.raises(NotAcknowledged) as caught:
                await client.invoke("work", {}, ack_deadline_ms=300)
    finally:
        await silent.unsubscribe()
    assert str(caught.value).startswith(
        "no agent acknowledged 'work' within 300 ms: not routed yet: no coordinator answered"
        " whether it runs within 0.5 s (one may be stopped, overloaded or cut off)"
    )


async def test_not_acknowledged_with_a_coordinator_says_where_the_task_waits(broker, coordinator):
    """When a coordinator runs and the agent is busy, NotAcknowledged says the task waits in
    that agent's queue (it said only that no agent acknowledged in time), not that no
    coordinator runs."""
    gate = asyncio.Event()
    agent = Agent("busy-1", startup_delay=0)

    @agent.handler("work", capacity=1)
    async def work(ctx: TaskContext, payload: dict) -> str:
        await gate.wait()
        return "done"

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        accepted = asyncio.Event()
        holding = asyncio.create_task(client.invoke("work", {}, on_ack=lambda _: accepted.set()))
        await accepted.wait()
        with pytest.raises(NotAcknowledged) as caught:
            await client.invoke("work", {}, ack_deadline_ms=300)
        gate.set()
        assert await holding == "done"
    assert str(caught.value) == (
        "no agent acknowledged 'work' within 300 ms: it waits in the queue of 'busy-1'"
        " (attempt 1), which has not taken it: all its places are busy, it stopped taking"
        " work, or it is cut off from NATS; it stays queued and may still run within its"
        " ttl: invoke again with"
        f" message_id={caught.value.message_id!r} to hear how it ends"
    )


async def test_not_acknowledged_says_a_task_no_agent_may_take_is_not_routed(broker, coordinator):
    """The only agent of the topic stopped (its card stays): the task is held in the intake,
    and NotAcknowledged says it is not routed and where to look."""
    agent = Agent("gone-1", startup_delay=0)

    @agent.handler("work")
    async def work(ctx: TaskContext, payload: dict) -> str:
        return "done"

    async with ReachClient(broker=broker) as client:
        async with agent.running(broker=broker):
            assert await client.invoke("work", {}) == "done"
        with pytest.raises(NotAcknowledged) as caught:
            await client.invoke("work", {}, ack_deadline_ms=300)
    assert str(caught.value).startswith(
        "no agent acknowledged 'work' within 300 ms: not routed yet: no agent serving it may"
        " take work now (`reach agents` says which), or tasks stored before it wait first;"
        " it stays queued"
    )


async def test_not_acknowledged_past_the_ttl_says_no_agent_will_start_it(broker):
    """A ttl shorter than the ack deadline: by the time no agent acknowledged, the ttl has
    passed, and the task will not "still run within its ttl" (a fresh reader got that
    hint, and the task ended `expired` 3 s later). No coordinator here: nothing answers
    the expiry before the deadline."""
    async with ReachClient(broker=broker) as client:
        with pytest.raises(NotAcknowledged) as caught:
            await client.invoke("work", {}, ack_deadline_ms=400, ttl_ms=200)
    said = str(caught.value)
    hint = (
        "its ttl (200 ms) has passed, so no agent will start it: invoke again with"
        f" message_id={caught.value.message_id!r} to hear how it ended"
    )
    assert said.startswith("no agent acknowledged 'work' within 400 ms: no coordinator")
    assert said.endswith(f"; {hint}")


async def test_publish_warns_when_no_coordinator_runs(broker):
    """publish() returns at once, queueing the task; a warning then says that no
    coordinator runs, so the task waits until one starts."""
    with capture_logs() as logs:
        async with ReachClient(broker=broker) as client:
            await client.publish("work", {})
            await eventually(lambda: [e for e in logs if e["log_level"] == "warning"])
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["event"].startswith("no coordinator is running")
    assert warning["topic"] == "work"


async def test_coordinator_runs_tells_the_three_cases_apart(broker, start_coordinator):
    """coordinator_runs(): False when nobody listens, True when one answers, None when it
    cannot be told (here: no connection)."""
    assert await coordinator_runs(broker) is False
    async with start_coordinator(fast()):
        assert await coordinator_runs(broker) is True
    assert await coordinator_runs(Broker(broker.url, names=broker.names)) is None


async def test_a_coordinator_back_within_seconds_is_not_called_gone(broker, start_coordinator):
    """Just after a server restart a caller may be back before the coordinators: nobody
    listens for a second. That is not "no coordinator is running": it is asked again for
    a few seconds before being said."""
    asking = asyncio.create_task(coordinator_runs(broker, timeout_s=5, none_for_s=10))
    await asyncio.sleep(1)  # the scenario: the coordinator comes back a second later
    assert not asking.done()
    async with start_coordinator(fast()):
        assert await asking is True

    async def gone() -> bool:  # asked once, not for seconds (its subscription goes first)
        return await coordinator_runs(broker, none_for_s=0) is False

    assert await until_true(gone)


async def test_a_refusal_after_an_attempt_ran_is_task_failed(broker, coordinator):
    """Attempt 1 ran and failed, and the ttl ran out before attempt 2: invoke raises
    TaskFailed (error.type expired), not Rejected, because a handler ran and sending the
    task again under a new id would run it twice."""
    agent = Agent("late-1", startup_delay=0)

    @agent.handler("late")
    async def late(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(0.4)
        raise ConnectionError("upstream down")

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke("late", {}, ttl_ms=300)
    assert not isinstance(caught.value, Rejected)
    assert caught.value.error.type == "expired"
    assert caught.value.ending == "expired"
    assert "attempt 1 failed: ConnectionError: upstream down" in str(caught.value)
    assert caught.value.attempts == 1  # the attempt that ran counts


async def test_an_expiry_before_any_agent_took_it_stays_rejected(broker, coordinator):
    """A task that expires waiting for a busy agent's one place never ran: invoke raises
    Rejected when its ttl runs out, while the other task still holds the place (it used to
    wait until the place freed)."""
    gate = asyncio.Event()
    agent = Agent("busy-2", startup_delay=0)

    @agent.handler("work", capacity=1)
    async def work(ctx: TaskContext, payload: dict) -> str:
        await gate.wait()
        return "done"

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        accepted = asyncio.Event()
        holding = asyncio.create_task(client.invoke("work", {}, on_ack=lambda _: accepted.set()))
        await accepted.wait()
        with pytest.raises(Rejected) as caught:
            await client.invoke("work", {}, ttl_ms=300, ack_deadline_ms=20_000)
        assert not holding.done()  # the place is still taken
        gate.set()
        assert await holding == "done"
    assert caught.value.reason == "expired"


async def test_after_not_acknowledged_the_same_id_gets_the_first_tasks_end(
    broker, start_coordinator
):
    """NotAcknowledged leaves the task queued; invoking again with its message_id, once a
    coordinator runs, answers with that task's result, and the handler runs once."""
    runs: Counter[str] = Counter()
    agent = worker("w-1", runs, topics=("work",))
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        with pytest.raises(NotAcknowledged) as caught:
            await client.invoke("work", {}, ack_deadline_ms=300)
        async with start_coordinator(fast()):
            again = await client.invoke("work", {}, message_id=caught.value.message_id)
    assert again == {"by": "w-1"}
    assert runs == {"w-1": 1}


def test_a_client_may_not_call_itself_the_coordinator() -> None:
    """`_coordinator` is the coordinator's sender token: a task sent under it on an open
    server was taken as the coordinator's own (no caller, no quota, not in its trace)."""
    with pytest.raises(agentreach.InvalidArgument, match="the coordinator's sender token"):
        ReachClient("nats://127.0.0.1:1", name="_coordinator")


async def test_a_client_used_before_it_is_open_says_to_enter_it(nats_url: str) -> None:
    """It said "the Broker is not open; use `async with Broker(...)`" to a user who never
    made a Broker."""
    client = ReachClient(nats_url)
    with pytest.raises(BrokerError) as raised:
        await client.invoke("anything", {})
    assert str(raised.value) == "the ReachClient is not open; use `async with ReachClient(…)`"
