"""Workflows through real agents and a real server: chains, fan-outs, state machines,
recovery, compensation, cancel."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections import Counter
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import (
    Agent,
    PermanentError,
    ReachClient,
    Rejected,
    TaskContext,
    TaskFailed,
)
from agentreach.broker import Broker, Bucket
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import cancel, read_record
from agentreach.coordinator.workflows.nesting import MAX_DEPTH
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.dashboard.trace import trace_of
from agentreach.envelopes.headers import control_headers, task_headers
from tests.cli.conftest import reach_argv, run
from tests.e2e.routing_support import fast, serving
from tests.support import eventually, until_true

ARTICLE = """
chain:
  - {name: plan, intent: plan}
  - {name: write, intent: write, input: {outline: "$.plan.outline", topic: "$.input.topic"}}
  - {name: review, intent: review}
  - {name: publish, intent: publish}
"""


BIG = """
chain:
  - {name: a, intent: measure}
  - {name: b, intent: measure, input: {blob: "$.input.blob", of: b}}
"""


def workflows(**yaml: str) -> dict[str, WorkflowSpec]:
    return {
        name: msgspec.yaml.decode(text.encode(), type=WorkflowSpec) for name, text in yaml.items()
    }


def newsroom(counts: Counter[str]) -> Agent:
    """plan → write → review → publish, each counting its runs and passing work on."""
    agent = Agent("newsroom", startup_delay=0)

    @agent.handler("plan")
    async def plan(ctx: TaskContext, payload: dict) -> dict:
        counts["plan"] += 1
        return {"outline": ["intro", payload["topic"], "outro"]}

    @agent.handler("write")
    async def write(ctx: TaskContext, payload: dict) -> dict:
        counts["write"] += 1
        return {"text": " / ".join(payload["outline"]), "topic": payload["topic"]}

    @agent.handler("review")
    async def review(ctx: TaskContext, payload: dict) -> dict:
        counts["review"] += 1
        return {**payload, "approved": True}

    @agent.handler("publish")
    async def publish(ctx: TaskContext, payload: dict) -> dict:
        counts["publish"] += 1
        return {"url": f"/articles/{payload['topic']}", "approved": payload["approved"]}

    return agent


async def test_a_four_step_chain_passes_outputs_on(broker, start_coordinator, watcher):
    """plan → write → review → publish: each output becomes (or is mapped into) the next
    input, and the starter gets the last output."""
    counts: Counter[str] = Counter()
    config = fast(workflows=workflows(article=ARTICLE))
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, newsroom(counts)),
        ReachClient(broker=broker) as client,
    ):
        result = await client.invoke("article", {"topic": "nats"}, trace_id="article-1")
        done = await watcher.event("workflow_completed")
        record = await read_record(broker, done.message_id)
        left = await _drained(broker)
    assert result == {"url": "/articles/nats", "approved": True}
    assert counts == Counter(plan=1, write=1, review=1, publish=1)
    assert left == 0  # no reply, and no timer of the ended instance, is left waiting
    assert record is not None and record.status == "completed"
    assert record.steps["write"].input == {"outline": ["intro", "nats", "outro"], "topic": "nats"}
    assert record.completed_order == ["plan", "write", "review", "publish"]
    step_routes = [e for e in watcher.events if e.event == "routed"]
    assert {e.trace_id for e in step_routes} == {"article-1"}  # every step in the trace
    assert [e.topic for e in step_routes] == ["plan", "write", "review", "publish"]


async def test_a_starting_payload_over_the_claim_check_threshold_reaches_the_steps(
    broker, start_coordinator
):
    """The intake stows a payload over 256 KiB in the Object Store; the steps got null (the
    record kept the reference, and nothing read it back)."""
    agent = Agent("measurer", startup_delay=0)

    @agent.handler("measure")
    async def measure(ctx: TaskContext, payload: dict) -> dict:
        return {"size": len(payload["blob"]), "of": payload.get("of")}

    flows = workflows(big=BIG)
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker) as client,
    ):
        result = await client.invoke("big", {"blob": "x" * 300_000}, message_id="big-1")
    assert result == {"size": 300_000, "of": "b"}


async def test_a_workflow_started_again_with_its_id_answers_the_first_result(
    broker, start_coordinator, watcher
):
    """The stream drops a starting message sent again within its duplicate window: the
    starter is answered with the first instance's result (from `workflow_completed`), and
    no step runs twice."""
    counts: Counter[str] = Counter()
    config = fast(workflows=workflows(article=ARTICLE))
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, newsroom(counts)),
        ReachClient(broker=broker) as client,
    ):
        first = await client.invoke("article", {"topic": "nats"}, message_id="article-again")
        again = await client.invoke("article", {"topic": "nats"}, message_id="article-again")
    assert first == again == {"url": "/articles/nats", "approved": True}
    assert counts == Counter(plan=1, write=1, review=1, publish=1)
    assert watcher.count("workflow_started") == 1


async def start_past_the_window(
    broker: Broker,
    caller: str,
    topic: str,
    message_id: str,
    reply_to: str,
    payload: Any = None,
) -> None:
    """``caller``'s start of ``topic`` under ``message_id``, as the stream takes it in once its
    duplicate window has passed (no Nats-Msg-Id)."""
    task = envelopes.Task(
        v=1,
        message_id=message_id,
        trace_id=message_id,
        topic=topic,
        payload={"topic": "nats"} if payload is None else payload,
        reply_to=reply_to,
    )
    headers = {k: v for k, v in task_headers(task).items() if k != "Nats-Msg-Id"}
    await broker.publish(broker.names.task(topic, caller), envelopes.encode(task), headers=headers)


async def test_a_workflow_started_again_past_the_duplicate_window_answers_from_its_record(
    broker, start_coordinator
):
    """Past the stream's duplicate window a start under a finished instance's id is taken
    in again: its starter gets the stored result (another caller: that the id is taken),
    and no step runs again."""
    counts: Counter[str] = Counter()
    names = broker.names
    config = fast(workflows=workflows(article=ARTICLE))
    heard: asyncio.Queue[tuple[str, envelopes.Reply]] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await heard.put((msg.subject.rsplit(".", 1)[-1], envelopes.decode_reply(msg.data)))

    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, newsroom(counts)),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        first = await alice.invoke("article", {"topic": "nats"}, message_id="article-old")
        for caller in ("alice", "mallory"):
            box = names.reply_box(caller, "again")
            sub = await broker.nc.subscribe(f"{box}.*", cb=keep)
            await start_past_the_window(broker, caller, "article", "article-old", box)
            sender, answer = await asyncio.wait_for(heard.get(), timeout=10)
            await sub.unsubscribe()
            assert sender == "_coordinator"
            if caller == "alice":
                assert isinstance(answer, envelopes.Result) and answer.result == first
            else:
                assert isinstance(answer, envelopes.ErrorReply)
                assert answer.error.type == "duplicate_id"
    assert counts == Counter(plan=1, write=1, review=1, publish=1)


async def test_another_workflow_started_under_an_instance_id_is_told_the_id_is_taken(
    broker, start_coordinator
):
    """A start of workflow 'essay' under the id of a finished 'article' instance was answered
    with the article's result (exit 0, nothing ran). Within the duplicate window the client
    sees the first events are another workflow's; past it the coordinator refuses it: both
    say duplicate_id, naming the workflow, and nothing runs."""
    counts: Counter[str] = Counter()
    names = broker.names
    config = fast(workflows=workflows(article=ARTICLE, essay=ARTICLE))
    heard: asyncio.Queue[envelopes.Reply] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await heard.put(envelopes.decode_reply(msg.data))

    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, newsroom(counts)),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        await alice.invoke("article", {"topic": "nats"}, message_id="article-1")
        with pytest.raises(Rejected) as within:
            await alice.invoke("essay", {"topic": "nats"}, message_id="article-1")
        box = names.reply_box("alice", "again")
        sub = await broker.nc.subscribe(f"{box}.*", cb=keep)
        await start_past_the_window(broker, "alice", "essay", "article-1", box)
        past = await asyncio.wait_for(heard.get(), timeout=10)
        await sub.unsubscribe()
    assert within.value.error.type == "duplicate_id"
    assert "was sent on topic 'article', this one on 'essay'" in within.value.error.message
    assert isinstance(past, envelopes.ErrorReply) and past.error.type == "duplicate_id"
    assert "an instance of workflow 'article', not 'essay'" in past.error.message
    assert counts == Counter(plan=1, write=1, review=1, publish=1)


async def test_a_start_with_another_payload_past_the_window_is_told_the_id_is_taken(
    broker, start_coordinator
):
    """Past the duplicate window, the same caller's start of the same workflow under a
    finished instance's id but with another payload got that instance's result, exit 0,
    nothing run (a trial). It is refused as duplicate_id, naming the digests; nothing runs."""
    counts: Counter[str] = Counter()
    names = broker.names
    heard: asyncio.Queue[envelopes.Reply] = asyncio.Queue()

    async def keep(msg: Any) -> None:
        await heard.put(envelopes.decode_reply(msg.data))

    async with (
        start_coordinator(fast(workflows=workflows(article=ARTICLE))) as coordinator,
        serving(broker, coordinator, newsroom(counts)),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        await alice.invoke("article", {"topic": "nats"}, message_id="article-2")
        box = names.reply_box("alice", "other")
        sub = await broker.nc.subscribe(f"{box}.*", cb=keep)
        other = {"topic": "kafka"}
        await start_past_the_window(broker, "alice", "article", "article-2", box, other)
        past = await asyncio.wait_for(heard.get(), timeout=10)
        await sub.unsubscribe()
    assert isinstance(past, envelopes.ErrorReply) and past.error.type == "duplicate_id"
    assert "started workflow 'article' with another payload (SHA-256" in past.error.message
    assert counts == Counter(plan=1, write=1, review=1, publish=1)


async def test_a_step_may_run_as_long_as_its_timeout(broker, start_coordinator):
    """A step with a ``timeout_s`` has that long to run (an agent used to stop it at the
    default 30 s); one without has the starting task's execute budget."""
    agent = Agent("patient", startup_delay=0)

    @agent.handler("ponder")
    async def ponder(ctx: TaskContext, payload: Any) -> int:
        return ctx.deadline_ms

    config = fast(
        workflows=workflows(
            slow="{ttl_s: 600, chain: [{name: a, intent: ponder, timeout_s: 120}]}",
            untimed="{ttl_s: 600, chain: [{name: a, intent: ponder}]}",
        )
    )
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker) as client,
    ):
        timed_ms = await client.invoke("slow", {}, ttl_ms=600_000)  # the ttl bounds it too
        untimed_ms = await client.invoke("untimed", {}, execute_deadline_ms=45_000)
    assert 110_000 < timed_ms <= 120_000
    assert untimed_ms == 45_000  # the starting task's execute budget, as before each retry


async def _drained(broker, timeout: float = 5.0) -> int:  # type: ignore[no-untyped-def]
    """Messages left in REACH_WORKFLOWS once the last acks have landed (an ack has no event)."""
    stream = broker.names.workflows_stream
    async with asyncio.timeout(timeout):
        while left := (await broker.js.stream_info(stream)).state.messages:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return left


def test_the_python_builder_equals_the_yaml() -> None:
    """The builder makes the same definitions as YAML (chain, fan-out, state machine)."""
    built = wf.chain(
        wf.step("plan", "plan"),
        wf.step("write", "write", input={"outline": "$.plan.outline", "topic": "$.input.topic"}),
        wf.step("review", "review"),
        wf.step("publish", "publish"),
    )
    assert built == workflows(article=ARTICLE)["article"]
    assert (
        wf.fanout([wf.step("a", "x"), wf.step("b", "y")], join=wf.Join(policy="quorum", quorum=1))
        == workflows(
            f="fanout: {branches: [{name: a, intent: x}, {name: b, intent: y}],"
            " join: {policy: quorum, quorum: 1}}"
        )["f"]
    )
    machine = wf.machine(
        "pending",
        {
            "pending": wf.state("charge", next=[wf.go("done", when=("paid", "==", True))]),
            "done": wf.state(terminal=True),
        },
    )
    assert machine == workflows(ORDER_SMALL=ORDER_SMALL)["ORDER_SMALL"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"on_failure": "undo"}, "Invalid enum value 'undo' - at `$.on_failure`"),
        ({"ttl_s": "soon"}, "Expected `float`, got `str` - at `$.ttl_s`"),
        ({"ttl_s": -5}, "Expected `float` > 0.0 - at `$.ttl_s`"),
    ],
)
def test_the_python_builder_checks_the_workflows_own_options(options, said) -> None:
    """As the YAML does: `on_failure="undo"` was served and undid nothing, `ttl_s="soon"`
    crashed every start (poison), `ttl_s=-5` expired every run at once."""
    steps = (wf.step("a", "x"), wf.step("b", "y"))
    for build in (
        lambda: wf.chain(*steps, **options),
        lambda: wf.steps(wf.step("a", "x"), wf.step("b", "y", after=["a"]), **options),
        lambda: wf.fanout(list(steps), **options),
    ):
        with pytest.raises(ValueError, match=re.escape(said)):
            build()


ORDER_SMALL = """
states:
  initial: pending
  states:
    pending: {intent: charge, next: [{when: {field: paid, op: "==", value: true}, to: done}]}
    done: {terminal: true}
"""

RESEARCH = """
fanout:
  branches:
    - {name: web, intent: search_web}
    - {name: papers, intent: search_papers}
    - {name: news, intent: search_news, timeout_s: 0.5, on_timeout: partial}
  join: {policy: all}
  then: {name: merge, intent: merge}
"""

QUORUM = """
fanout:
  branches:
    - {name: web, intent: search_web}
    - {name: papers, intent: search_papers}
    - {name: news, intent: search_news}
  join: {policy: quorum, quorum: 2}
  then: {name: merge, intent: merge}
"""


def researchers(news_gate: asyncio.Event, counts: Counter[str]) -> Agent:
    agent = Agent("researcher", startup_delay=0)

    @agent.handler("search_web")
    async def web(ctx: TaskContext, payload: dict) -> list[str]:
        counts["web"] += 1
        return [f"web:{payload['q']}"]

    @agent.handler("search_papers")
    async def papers(ctx: TaskContext, payload: dict) -> list[str]:
        counts["papers"] += 1
        return [f"paper:{payload['q']}"]

    @agent.handler("search_news")
    async def news(ctx: TaskContext, payload: dict) -> list[str]:
        counts["news"] += 1
        await news_gate.wait()  # stuck until the test lets it go
        return ["news: too late"]

    @agent.handler("merge")
    async def merge(ctx: TaskContext, payload: dict) -> dict:
        counts["merge"] += 1
        return payload

    return agent


async def test_a_branch_that_times_out_gives_a_partial_join(broker, start_coordinator):
    """Three branches, one stuck past its timeout: the join gets two results and the
    timeout reason, and the stuck branch blocks nothing."""
    gate, counts = asyncio.Event(), Counter[str]()
    async with (
        start_coordinator(fast(workflows=workflows(research=RESEARCH))) as coordinator,
        serving(broker, coordinator, researchers(gate, counts)),
        ReachClient(broker=broker) as client,
    ):
        merged = await client.invoke("research", {"q": "nats"})
        gate.set()
    assert merged["results"] == {"web": ["web:nats"], "papers": ["paper:nats"]}
    assert merged["missing"] == {"news": "step 'news' did not finish within 0.5 s"}
    assert counts["merge"] == 1


async def test_a_quorum_of_two_out_of_three(broker, start_coordinator, watcher):
    """quorum: 2 joins as soon as two branches are done; the third's late result is ignored."""
    gate, counts = asyncio.Event(), Counter[str]()
    async with (
        start_coordinator(fast(workflows=workflows(research=QUORUM))) as coordinator,
        serving(broker, coordinator, researchers(gate, counts)),
        ReachClient(broker=broker) as client,
    ):
        merged = await client.invoke("research", {"q": "kv"})
        done = await watcher.event("workflow_completed")
        gate.set()
        late = await watcher.event("completed", topic="search_news")
        record = await read_record(broker, done.message_id)
    assert merged == {
        "results": {"web": ["web:kv"], "papers": ["paper:kv"]},
        "missing": {"news": "not finished when joined"},
    }
    assert late.detail["result"] == ["news: too late"]
    assert record is not None and record.steps["news"].status == "cancelled"
    assert record.result == merged


ORDER = """
states:
  initial: pending
  states:
    pending:
      intent: charge
      next:
        - {when: {field: paid, value: true}, to: paid}
        - {to: refunded}
    paid: {intent: reserve_stock, next: [{to: processing}]}
    processing: {intent: ship, next: [{to: done}]}
    done: {terminal: true, input: {order: "$.input.order", tracking: "$.processing.tracking"}}
    refunded: {intent: refund, terminal: true}
"""


def shop(log: list[str]) -> Agent:
    agent = Agent("shop", startup_delay=0)

    @agent.handler("charge")
    async def charge(ctx: TaskContext, payload: dict) -> dict:
        log.append(f"charge {payload['order']}")
        return {"paid": payload["card"] == "ok", "order": payload["order"]}

    @agent.handler("reserve_stock")
    async def reserve(ctx: TaskContext, payload: dict) -> dict:
        log.append(f"reserve {payload['order']}")
        return payload

    @agent.handler("ship")
    async def ship(ctx: TaskContext, payload: dict) -> dict:
        log.append(f"ship {payload['order']}")
        return {"tracking": f"T-{payload['order']}"}

    @agent.handler("refund")
    async def refund(ctx: TaskContext, payload: dict) -> dict:
        log.append(f"refund {payload['order']}")
        return {"refunded": payload["order"]}

    return agent


async def test_an_order_state_machine_and_its_refund_branch(broker, start_coordinator, watcher):
    """pending → paid → processing → done for a good card; pending → refunded for a bad one."""
    log: list[str] = []
    async with (
        start_coordinator(fast(workflows=workflows(order=ORDER))) as coordinator,
        serving(broker, coordinator, shop(log)),
        ReachClient(broker=broker) as client,
    ):
        shipped = await client.invoke("order", {"order": "o1", "card": "ok"})
        refunded = await client.invoke("order", {"order": "o2", "card": "declined"})

        def both_ended() -> list | None:  # the caller is answered before the event is sent
            ends = [e for e in watcher.events if e.event == "workflow_completed"]
            return ends if len(ends) == 2 else None

        ends = await watcher.until(both_ended, "two workflow_completed events")
    assert shipped == {"order": "o1", "tracking": "T-o1"}
    assert refunded == {"refunded": "o2"}
    assert log == ["charge o1", "reserve o1", "ship o1", "charge o2", "refund o2"]
    paths = [e.detail["path"] for e in ends]
    assert paths == [["pending", "paid", "processing", "done"], ["pending", "refunded"]]


SAGA = """
on_failure: compensate
chain:
  - {name: reserve, intent: reserve, compensate: release}
  - {name: charge, intent: charge_card, compensate: refund_card}
  - {name: notify, intent: notify}
  - {name: ship, intent: ship_parcel, compensate: recall}
"""


def warehouse(log: list[str], *, ship_gate: asyncio.Event | None = None) -> Agent:
    agent = Agent("warehouse", startup_delay=0)

    def record(name: str):  # type: ignore[no-untyped-def]
        async def handle(ctx: TaskContext, payload: Any) -> dict:
            log.append(name)
            if name == "ship_parcel":
                if ship_gate is None:
                    raise PermanentError("no courier for this address")
                await ship_gate.wait()
            return {"done": name}

        return handle

    intents = (
        "reserve",
        "release",
        "charge_card",
        "refund_card",
        "notify",
        "ship_parcel",
        "recall",
    )
    for intent in intents:
        agent.handler(intent)(record(intent))
    return agent


async def test_saga_compensation_runs_in_reverse_after_a_failing_step(
    broker, start_coordinator, watcher
):
    """ship fails for good: charge, then reserve are compensated (notify has no undo), the
    starter gets the error, and workflow_failed carries the whole state."""
    log: list[str] = []
    async with (
        start_coordinator(fast(workflows=workflows(fulfil=SAGA))) as coordinator,
        serving(broker, coordinator, warehouse(log)),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("fulfil", {"order": "o9"})
        letter = await watcher.dead_letter("workflow_failed")
    assert log == ["reserve", "charge_card", "notify", "ship_parcel", "refund_card", "release"]
    assert failed.value.error.type == "PermanentError"
    assert letter.state is not None and letter.state["status"] == "failed"
    assert list(letter.state["compensations"]) == ["charge", "reserve"]
    assert letter.state["steps"]["ship"]["status"] == "failed"
    assert letter.envelope is not None and letter.envelope.payload == {"order": "o9"}


LOOP = """
on_failure: compensate
states:
  initial: pay
  states:
    pay: {intent: charge_card, compensate: refund_card, next: [{to: hold}]}
    hold: {next: [{event: again, to: pay}, {event: fail, to: ship}]}
    ship: {intent: ship_parcel, next: [{to: done}]}
    done: {terminal: true}
"""


async def test_a_state_entered_three_times_is_undone_three_times(
    broker, start_coordinator, watcher
):
    """A loop charged three times, then its last state failed: each charge is refunded, the
    latest first, each refund given the visit it undoes (only the last was, two charges
    stood)."""
    charges: list[int] = []
    refunds: list[Any] = []
    agent = Agent("till", startup_delay=0)

    @agent.handler("charge_card")
    async def charge(ctx: TaskContext, payload: Any) -> dict:
        charges.append(len(charges) + 1)
        return {"charge": charges[-1]}

    @agent.handler("ship_parcel")
    async def ship(ctx: TaskContext, payload: Any) -> dict:
        raise PermanentError("no courier")

    @agent.handler("refund_card")
    async def refund(ctx: TaskContext, payload: Any) -> dict:
        refunds.append((ctx.message_id, payload["step"], payload["output"]))
        return {"refunded": True}

    async with (
        start_coordinator(fast(workflows=workflows(loop=LOOP))) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker) as client,
    ):
        instance = envelopes.new_id()
        invoked = asyncio.create_task(client.invoke("loop", {}, message_id=instance))
        for event in ("again", "again", "fail"):
            await _until_record(broker, instance, lambda r: r.current == "hold")
            assert (await client.signal_workflow(instance, event)).taken
        with pytest.raises(TaskFailed):
            await invoked
    assert charges == [1, 2, 3]
    assert [(m.rpartition("-")[2], step, out) for m, step, out in refunds] == [
        ("undo", "pay", {"charge": 3}),
        ("undo2", "pay", {"charge": 2}),
        ("undo1", "pay", {"charge": 1}),
    ]


async def test_cancel_mid_flight_stops_and_compensates(broker, start_coordinator, watcher):
    """`reach workflows cancel ID` while a step runs: nothing more is dispatched, and the
    undoing waits for the running step; it completes after the cancel, so it is the latest
    done and undone first (its effect happened), then the completed steps in reverse; the
    starter hears `cancelled`, and `workflow_cancelled` is published, once all of it is
    undone."""
    log: list[str] = []
    gate = asyncio.Event()
    async with (
        start_coordinator(fast(workflows=workflows(fulfil=SAGA))) as coordinator,
        serving(broker, coordinator, warehouse(log, ship_gate=gate)),
        ReachClient(broker=broker) as client,
    ):
        starting = asyncio.create_task(
            client.invoke("fulfil", {"order": "o7"}, ack_deadline_ms=5000)
        )
        shipping = await watcher.event("accepted", topic="ship_parcel")
        instance = (await watcher.event("workflow_started")).message_id
        argv = reach_argv(broker, "workflows", "cancel", instance, "out of stock", "--wait", "0")
        cancelled = await run(*argv)
        waiting = await watcher.event("compensating", message_id=instance)
        shown_waiting = await run(*reach_argv(broker, "workflows", "show", instance))
        assert not starting.done() and not [e for e in watcher.events if e.topic == "recall"]
        gate.set()
        await watcher.event("compensating_late_step", message_id=shipping.message_id)
        with pytest.raises(TaskFailed) as stopped:
            await starting
        await watcher.event("workflow_cancelled", message_id=instance)
        record = await _until_record(broker, instance, lambda r: r.status == "cancelled")
        shown = await run(*reach_argv(broker, "workflows", "list"))
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancel requested" in cancelled.stdout.splitlines()[-1]
    assert "· compensating" in shown_waiting.stdout.splitlines()[0]
    assert "  undoing waits first for the outcome of ship" in shown_waiting.stdout
    assert waiting.detail["waiting_for"] == ["ship"]
    assert waiting.detail["undo"] == ["charge", "reserve"]
    assert (stopped.value.error.type, stopped.value.error.message) == ("cancelled", "out of stock")
    assert log == [
        "reserve",
        "charge_card",
        "notify",
        "ship_parcel",
        "recall",
        "refund_card",
        "release",
    ]
    assert record.ended_ms >= max(undo.ended_ms for undo in record.compensations.values())
    assert record.steps["ship"].status == "completed"
    assert list(record.compensations) == ["ship", "charge", "reserve"]
    assert all(undo.status == "completed" for undo in record.compensations.values())
    assert f"{instance}" in shown.stdout and "cancelled" in shown.stdout
    assert watcher.count("workflow_cancelled") == 1


def _undone(key: str):  # type: ignore[no-untyped-def]
    return lambda r: key in r.compensations and r.compensations[key].status == "completed"


async def _until_record(broker, instance: str, wanted):  # type: ignore[no-untyped-def]
    """The instance's record once ``wanted(record)`` holds (read again until then, bounded)."""
    async with asyncio.timeout(10):
        while True:
            if (record := await read_record(broker, instance)) is not None and wanted(record):
                return record
            await asyncio.sleep(0.05)  # the record's write is the engine's: no event for it


async def test_the_dashboard_trace_of_an_instance_shows_its_steps_and_its_end(
    broker, start_coordinator, watcher
):
    """The dashboard's timeline of an instance id: the instance and each of its steps, every
    one ended (it showed the instance alone, still "in flight", with a total up to now)."""
    flow = """
chain:
  - {name: plan, intent: plan}
  - {name: write, intent: write, input: {outline: "$.plan.outline", topic: "$.input.topic"}}
"""
    async with (
        start_coordinator(fast(workflows=workflows(draft=flow))) as coordinator,
        serving(broker, coordinator, newsroom(Counter())),
        ReachClient(broker=broker) as client,
    ):
        await client.invoke("draft", {"topic": "nats"})
        instance = (await watcher.event("workflow_completed")).message_id

        async def ended() -> dict | None:  # the ending event is stored just after it is seen
            shown = await trace_of(broker, instance)
            mine = [m for m in (shown or {}).get("messages", []) if m["message_id"] == instance]
            return shown if mine and mine[0]["status"] == "completed" else None

        shown = await until_true(ended)
    topics = sorted(m["topic"] for m in shown["messages"])
    assert topics == ["draft", "plan", "write"]
    assert all(m["status"] == "completed" and m["ended_ms"] for m in shown["messages"])


NESTED = """
chain:
  - {name: draft, intent: article}
  - {name: announce, intent: announce, input: {link: "$.draft.url"}}
"""


async def test_a_step_may_be_another_workflow(broker, start_coordinator, watcher):
    """A step whose intent names a workflow runs it as a child, in the same trace."""
    counts: Counter[str] = Counter()
    herald = Agent("herald", startup_delay=0)

    @herald.handler("announce")
    async def announce(ctx: TaskContext, payload: dict) -> str:
        return f"read {payload['link']}"

    flows = workflows(article=ARTICLE, campaign=NESTED)
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, newsroom(counts), herald),
        ReachClient(broker=broker) as client,
    ):
        said = await client.invoke("campaign", {"topic": "kv"}, trace_id="campaign-1")
    assert said == "read /articles/kv"
    started = [e for e in watcher.events if e.event == "workflow_started"]
    assert [e.topic for e in started] == ["campaign", "article"]
    assert {e.trace_id for e in started} == {"campaign-1"}
    assert counts["publish"] == 1


APPROVAL = """
states:
  initial: submitted
  states:
    submitted:
      intent: check
      next:
        - {event: approve, to: approved}
        - {event: reject, to: rejected}
    approved: {terminal: true, input: {ok: true}}
    rejected: {terminal: true, input: {ok: false}}
"""


def approval_checker() -> Agent:
    """The agent of APPROVAL's one intent, ``check``."""
    agent = Agent("checker", startup_delay=0)

    @agent.handler("check")
    async def check(ctx: TaskContext, payload: object) -> str:
        return "looks fine"

    return agent


async def test_a_state_machine_moves_on_an_event(broker, start_coordinator, watcher):
    """A state that waits for events moves on `reach workflows signal ID EVENT`."""
    checker = approval_checker()
    async with (
        start_coordinator(fast(workflows=workflows(approval=APPROVAL))) as coordinator,
        serving(broker, coordinator, checker),
        ReachClient(broker=broker) as client,
    ):
        waiting = asyncio.create_task(client.invoke("approval", {}))
        await watcher.event("completed", topic="check")
        instance = (await watcher.event("workflow_started")).message_id
        await _until_record(broker, instance, lambda r: r.steps["submitted"].status == "completed")
        before = await run(*reach_argv(broker, "workflows", "show", instance))
        signalled = await run(*reach_argv(broker, "workflows", "signal", instance, "approve"))
        outcome = await waiting
        shown = await run(*reach_argv(broker, "workflows", "show", instance))
    assert signalled.returncode == 0, signalled.stderr
    assert "approve taken in state submitted" in signalled.stdout  # the state that took it
    assert outcome == {"ok": True}
    [waits] = [
        line for line in before.stdout.splitlines() if "submitted" in line and "check" in line
    ]
    assert "completed" in waits and "waits here for a signal" in waits
    assert "path: submitted → approved" in shown.stdout
    assert "waits here" not in shown.stdout


async def test_a_signal_stored_before_its_instance_started_is_taken_once_it_has(
    broker, start_coordinator, watcher
):
    """A caller that signals at once after its publish got `signal_ignored` naming the very
    event its state takes (a fresh reader: 4 of 5 back to back): the signal was handled
    before the start left the intake, with no record to move. It is looked at again, and
    taken as soon as the instance runs."""
    checker = approval_checker()
    async with (
        start_coordinator(fast(workflows=workflows(approval=APPROVAL))) as coordinator,
        serving(broker, coordinator, checker),
        ReachClient(broker=broker) as client,
    ):
        instance = envelopes.new_id()
        signal = broker.names.workflow_signal(instance, "approve")
        await broker.publish(signal, b"", headers=control_headers("signal"))
        outcome = await client.invoke("approval", {}, message_id=instance)
    assert outcome == {"ok": True}
    assert watcher.count("signal_ignored") == 0


async def test_the_cli_waits_a_moment_for_the_instance_it_signals(
    broker, start_coordinator, monkeypatch
):
    """`reach workflows signal` run as the start was published said "no workflow instance"
    at once and sent nothing (an outside trial), where the docs say a signal sent before
    its instance exists is looked at again, and the SDKs wait 2 s for the start. It reads
    the record again for 2 s; one that never comes is said, with where to look."""
    missed = asyncio.Event()
    real_get = Bucket.get

    async def get(self, key, **options):  # type: ignore[no-untyped-def]
        entry = await real_get(self, key, **options)
        if entry is None:
            missed.set()
        return entry

    async with (
        start_coordinator(fast(workflows=workflows(approval=APPROVAL))) as coordinator,
        serving(broker, coordinator, approval_checker()),
        ReachClient(broker=broker) as client,
    ):
        instance = envelopes.new_id()
        monkeypatch.setattr(Bucket, "get", get)
        reading = asyncio.create_task(read_record(broker, instance, within_s=10))
        await asyncio.wait_for(missed.wait(), 5)  # not there yet when first read
        monkeypatch.setattr(Bucket, "get", real_get)
        await client.publish("approval", {}, message_id=instance)
        found = await asyncio.wait_for(reading, 15)
        nothing = await run(*reach_argv(broker, "workflows", "signal", "never-started", "go"))
    assert found is not None and found.instance_id == instance
    assert nothing.returncode == 1
    assert "no workflow instance 'never-started' within 2 s" in nothing.stderr
    assert "`reach workflows list` lists them" in nothing.stderr
    assert "`reach trace never-started` says what became of a start" in nothing.stderr


async def test_a_signal_no_state_waits_for_is_said_and_not_redelivered(
    broker, start_coordinator, watcher
):
    """`reach workflows signal ID nope`: exit 1 naming it, the instance untouched, and the
    signal settled (no crash, no redelivery every few seconds)."""
    checker = approval_checker()
    async with (
        start_coordinator(fast(workflows=workflows(approval=APPROVAL))) as coordinator,
        serving(broker, coordinator, checker),
        ReachClient(broker=broker) as client,
    ):
        waiting = asyncio.create_task(client.invoke("approval", {}))
        await watcher.event("completed", topic="check")
        instance = (await watcher.event("workflow_started")).message_id
        ignored = await run(*reach_argv(broker, "workflows", "signal", instance, "nope"))
        taken = await run(*reach_argv(broker, "workflows", "signal", instance, "reject"))
        outcome = await waiting
        info = await broker.js.consumer_info(
            broker.names.workflows_stream, broker.names.coordinator_workflows
        )
    assert ignored.returncode == 1, ignored.stdout + ignored.stderr
    assert "no state waits for nope" in ignored.stdout
    assert "it takes approve, reject" in ignored.stdout  # what the state would have taken
    assert taken.returncode == 0 and "reject taken" in taken.stdout
    assert outcome == {"ok": False}
    assert info.num_ack_pending == 0 and info.num_redelivered == 0


async def test_trace_shows_a_workflow_as_a_tree(broker, start_coordinator, watcher):
    """`reach trace ID` starts with the workflow's tree: each step's state and timing."""
    counts: Counter[str] = Counter()
    async with (
        start_coordinator(fast(workflows=workflows(article=ARTICLE))) as coordinator,
        serving(broker, coordinator, newsroom(counts)),
        ReachClient(broker=broker) as client,
    ):
        await client.invoke("article", {"topic": "t"}, trace_id="tree-1")
        traced = await run(*reach_argv(broker, "trace", "tree-1"))
    assert traced.returncode == 0, traced.stderr
    lines = traced.stdout.splitlines()
    assert lines[0].startswith("workflow article ") and "· completed" in lines[0]
    steps = [line.split()[1] for line in lines[1:5]]
    assert steps == ["plan", "write", "review", "publish"]
    assert all(" completed " in line for line in lines[1:5])
    assert "└─ publish" in lines[4]


async def test_a_killed_coordinator_mid_chain_is_resumed_and_no_step_runs_twice(
    broker, start_coordinator, watcher, tmp_path
):
    """kill -9 of the coordinator while `write` runs; a new coordinator finishes the chain,
    and every step's side effect happened once."""
    counts: Counter[str] = Counter()
    writing, gate = asyncio.Event(), asyncio.Event()
    room = newsroom(counts)
    plain_write = room.handlers["write"].func

    async def slow_write(ctx: TaskContext, payload: dict) -> dict:
        writing.set()
        await gate.wait()
        return await plain_write(ctx, payload)

    room.handlers["write"] = dataclasses.replace(room.handlers["write"], func=slow_write)
    config_path = tmp_path / "coordinator.yaml"
    config_path.write_text(
        "delivery: {base_s: 0.05, cap_s: 0.2}\nworkflows:\n  article:\n"
        + "\n".join("    " + line for line in ARTICLE.strip().splitlines())
        + "\n"
    )
    first = await asyncio.create_subprocess_exec(
        *map(str, reach_argv(broker, "coordinator", "--config", str(config_path))),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with room.running(broker=broker), ReachClient(broker=broker) as client:
            starting = asyncio.create_task(
                client.invoke("article", {"topic": "crash"}, ack_deadline_ms=20_000)
            )
            await asyncio.wait_for(writing.wait(), 20)
            first.kill()  # SIGKILL: no shutdown of any kind
            await first.wait()
            gate.set()
            from agentreach.coordinator import load_config

            async with start_coordinator(load_config(config_path)):
                result = await asyncio.wait_for(starting, 60)
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert result == {"url": "/articles/crash", "approved": True}
    assert counts == Counter(plan=1, write=1, review=1, publish=1)


async def test_two_replicas_share_the_instances_without_losing_a_step(
    broker, start_coordinator, watcher
):
    """Two coordinator replicas take the replies of 20 concurrent fan-outs between them:
    every instance completes, each branch ran once (conditional writes, no lost update)."""
    counts: Counter[str] = Counter()
    fan = "fanout: {branches: [{name: a, intent: count_a}, {name: b, intent: count_b},"
    fan += " {name: c, intent: count_c}]}"
    counter = Agent("counter", startup_delay=0)

    def counting(name: str):  # type: ignore[no-untyped-def]
        async def count(ctx: TaskContext, payload: dict) -> str:
            counts[name] += 1
            return name

        return count

    for name in ("count_a", "count_b", "count_c"):
        counter.handler(name, capacity=30)(counting(name))
    config = fast(workflows=workflows(fan=fan))
    async with (
        start_coordinator(config) as one,
        start_coordinator(config),
        serving(broker, one, counter),
        ReachClient(broker=broker) as client,
    ):
        results = await asyncio.gather(*(client.invoke("fan", {"i": i}) for i in range(20)))
        # Each instance's event follows its answer: looked for, not counted at once.
        await watcher.until(lambda: watcher.count("workflow_completed") >= 20 or None, "20 ends")
    assert all(r["results"] == {"a": "count_a", "b": "count_b", "c": "count_c"} for r in results)
    assert counts == Counter(count_a=20, count_b=20, count_c=20)
    assert watcher.count("workflow_completed") == 20


async def test_an_unreadable_workflow_message_is_dead_lettered(broker, start_coordinator, watcher):
    """A garbled step reply or timer, or an unknown kind, ends in REACH_DLQ with the reason."""
    async with start_coordinator(fast(workflows=workflows(article=ARTICLE))):
        names, said = broker.names, {"Reach-Kind": "garbled"}  # a party's: it has headers
        reply = names.workflow_reply("some-instance")
        await broker.publish(reply, b'{"kind": "result"', headers=said)
        await broker.publish(names.workflow_timer("some-instance"), b'{"key": 1}', headers=said)
        await broker.publish(f"{names.prefix}.wf.bogus.some-instance", b"{}", headers=said)
        await watcher.until(lambda: len(watcher.dead_letters) >= 3 or None, "3 dead letters")
    letters = watcher.dead_letters
    assert {d.reason for d in letters} == {"invalid_envelope"}
    assert {d.trace_id for d in letters} == {"some-instance"}
    messages = sorted(d.error.message for d in letters if d.error)
    assert "no workflow message kind 'bogus' - at `subject`" in messages
    assert any("truncated" in m for m in messages)
    assert any("$.key" in m for m in messages)
    assert {d.headers["Reach-Subject"].split(".")[2] for d in letters} == {
        "reply",
        "timer",
        "bogus",
    }


def holder(gate: asyncio.Event) -> Agent:
    """`hold` waits for ``gate``; `unhold`, `tick` and `after_hold` answer at once."""
    agent = Agent("holder", startup_delay=0)

    @agent.handler("hold")
    async def hold(ctx: TaskContext, payload: Any) -> str:
        await gate.wait()
        return "held"

    for intent in ("unhold", "tick", "after_hold"):
        agent.handler(intent)(_answering(intent))
    return agent


def _answering(intent: str):  # type: ignore[no-untyped-def]
    async def answer(ctx: TaskContext, payload: Any) -> str:
        return intent

    return answer


INNER = """
on_failure: compensate
chain:
  - {name: hold, intent: hold, compensate: unhold}
  - {name: after, intent: after_hold}
"""


async def test_cancelling_a_workflow_cancels_its_child_workflows(
    broker, start_coordinator, watcher
):
    """`reach workflows cancel` of `outer` while its grandchild `inner` holds a step: every
    level ends cancelled and `inner` dispatches no further step; its held step, completing
    after the cancel, is compensated as in any cancelled instance."""
    gate = asyncio.Event()
    flows = workflows(
        outer="chain: [{name: middle, intent: middle}]",
        middle="chain: [{name: inner, intent: inner}]",
        inner=INNER,
    )
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, holder(gate)),
        ReachClient(broker=broker) as client,
    ):
        starting = asyncio.create_task(client.invoke("outer", {}, ack_deadline_ms=5000))
        holding = await watcher.event("accepted", topic="hold")
        outer = (await watcher.event("workflow_started", topic="outer")).message_id
        cancelled = await run(*reach_argv(broker, "workflows", "cancel", outer))
        with pytest.raises(TaskFailed) as stopped:
            await starting
        await watcher.event("workflow_cancelled", topic="middle")
        # inner undoes what it did, and waits for its held step's outcome first.
        inner = (await watcher.event("compensating", topic="inner")).message_id
        gate.set()

        def next_move():  # type: ignore[no-untyped-def]
            late = ("compensating_late_step", "hold"), ("routed", "after_hold")
            return next((e for e in watcher.events if (e.event, e.topic) in late), None)

        moved = await watcher.until(next_move, "what inner does with the held step's result")
        await watcher.event("completed", topic="unhold")
        await watcher.event("workflow_cancelled", message_id=inner)
        record = await _until_record(broker, inner, _undone("hold"))
    assert cancelled.returncode == 0, cancelled.stderr
    assert stopped.value.error.type == "cancelled"
    assert moved.event == "compensating_late_step" and moved.message_id == holding.message_id
    assert not [e for e in watcher.events if e.topic == "after_hold"]
    assert record is not None and record.status == "cancelled" and record.error is not None
    assert "cancelled with its parent workflow" in record.error.message


async def test_a_cancelled_saga_answers_after_its_child_has_undone_its_own_steps(
    broker, start_coordinator, watcher
):
    """`outer` (a saga: `tick` with an undo, then the child `inner`) is cancelled while
    inner holds a step: inner undoes its held step, then answers; only then does outer undo
    `tick` and answer its starter, so a `cancelled` answer means everything below is undone."""
    gate = asyncio.Event()
    flows = workflows(
        outer=(
            "on_failure: compensate\n"
            "chain: [{name: first, intent: tick, compensate: unhold}, {name: sub, intent: inner}]"
        ),
        inner=INNER,
    )
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, holder(gate)),
        ReachClient(broker=broker) as client,
    ):
        starting = asyncio.create_task(client.invoke("outer", {}, ack_deadline_ms=5000))
        await watcher.event("accepted", topic="hold")
        outer = (await watcher.event("workflow_started", topic="outer")).message_id
        await cancel(broker, outer)
        await watcher.event("compensating", topic="inner")
        await watcher.event("compensating", message_id=outer)
        assert not starting.done()
        gate.set()
        with pytest.raises(TaskFailed) as stopped:
            await starting
        await watcher.event("workflow_cancelled", message_id=outer)
        ended = [e for e in watcher.events if e.event == "workflow_cancelled"]
        undos = [e for e in watcher.events if e.event == "completed" and e.topic == "unhold"]
    assert stopped.value.error.type == "cancelled"
    assert [e.topic for e in ended] == ["inner", "outer"]
    assert len(undos) == 2  # inner's held step, then outer's first


async def test_a_child_past_its_steps_timeout_undoes_its_steps_with_their_own_budget(
    broker, start_coordinator, watcher
):
    """The parent's step `kid` (timeout 1.5 s) runs the child `inner2`, whose second step
    holds: at 1.5 s the child expires and undoes its first step with an undo that takes 2 s,
    longer than the step's timeout. The undo gets the starting task's budget (it got the
    timeout, and failed `deadline_exceeded`: "their effects stand"), and the parent answers
    once the child has."""
    gate = asyncio.Event()
    agent = holder(gate)

    @agent.handler("slow_undo")
    async def slow_undo(ctx: TaskContext, payload: Any) -> str:
        await asyncio.sleep(2.0)
        return "undone"

    flows = workflows(
        outer2="on_failure: compensate\nchain: [{name: kid, intent: inner2, timeout_s: 1.5}]",
        inner2=(
            "on_failure: compensate\n"
            "chain: [{name: first, intent: tick, compensate: slow_undo},"
            " {name: held, intent: hold}]"
        ),
    )
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, agent),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("outer2", {}, message_id="outer2-1")
        gate.set()
        undone = await watcher.event("completed", topic="slow_undo")
        inner = await watcher.event("workflow_failed", topic="inner2")
        outer = await watcher.event("workflow_failed", message_id="outer2-1")
    assert failed.value.error.type == "timeout"
    assert "effects stand" not in failed.value.error.message
    assert inner.detail.get("undo_failed") is None
    order = [id(e) for e in watcher.events]
    assert order.index(id(undone)) < order.index(id(inner)) < order.index(id(outer))


@pytest.mark.parametrize("execute_ms", [10_000, 1500])
async def test_a_workflow_ends_as_expired_at_its_starting_tasks_ttl(
    broker, start_coordinator, watcher, execute_ms
):
    """Started with a ttl of 1.5 s (its own ttl_s is 300 s) while its first step is held: at
    the ttl the starter hears `expired`, the instance is dead-lettered as `expired` with its
    state, and its next step is never dispatched. A starter that waits exactly the ttl
    (`reach publish --wait --ttl-ms`) hears the verdict too, not its own timeout."""
    gate = asyncio.Event()
    flows = workflows(ttlchain="chain: [{name: one, intent: hold}, {name: two, intent: tick}]")
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, holder(gate)),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(TaskFailed) as expired:
            await client.invoke("ttlchain", {}, ttl_ms=1500, execute_deadline_ms=execute_ms)
        letter = await watcher.dead_letter("expired", topic="ttlchain")
        gate.set()
    assert expired.value.error.type == "expired"
    assert "ttl 1500 ms of the task that started it passed" in expired.value.error.message
    assert letter.state is not None and letter.state["status"] == "failed"
    assert letter.state["steps"]["one"]["status"] == "cancelled"
    assert "two" not in letter.state["steps"]
    assert not [e for e in watcher.events if e.topic == "tick"]


def _nested(levels: int) -> dict[str, WorkflowSpec]:
    """n0 runs n1, which runs n2, … down to the last, whose one step passes its input on."""
    specs = {f"n{i}": wf.chain(wf.step("down", f"n{i + 1}")) for i in range(levels - 1)}
    specs[f"n{levels - 1}"] = wf.chain(wf.step("bottom"))
    return specs


async def test_workflows_nested_past_the_limit_fail_at_run_time(broker, start_coordinator, watcher):
    """No loop, but too deep: MAX_DEPTH levels below the caller's workflow run; one more
    fails there as `too_deep`, and so does every level above it."""
    levels = MAX_DEPTH + 2
    async with (
        start_coordinator(fast(workflows=_nested(levels))),
        ReachClient(broker=broker) as client,
    ):
        assert await client.invoke("n1", "deep enough") == "deep enough"
        with pytest.raises(TaskFailed) as failed:
            await client.invoke("n0", "too deep")
        bottom = await watcher.dead_letter("workflow_failed", topic=f"n{levels - 1}")
    assert failed.value.error.type == "too_deep"
    assert bottom.error is not None and f"more than {MAX_DEPTH}" in bottom.error.message
    assert watcher.count("workflow_completed") == levels - 1  # n1 … n9, the first time


async def test_a_workflow_named_as_an_intent_agents_serve_says_they_get_none(
    broker, start_coordinator
):
    """A workflow `b2` and an agent serving `b2`: every task started the workflow and the
    agent's handler was never reached, nothing said so (a walkthrough). It is said once,
    when the agent's card is written, before any task."""
    agent = Agent("b2-server", startup_delay=0)
    agent.handler("b2")(lambda ctx, payload: "the agent's")
    agent.handler("noop")(lambda ctx, payload: payload)
    flows = {"b2": wf.chain(wf.step("only", "noop"))}
    with capture_logs() as logs:
        async with (
            start_coordinator(fast(workflows=flows)) as coordinator,
            serving(broker, coordinator, agent),
            ReachClient(broker=broker) as client,
        ):
            await eventually(lambda: any(e["event"].startswith("a workflow takes") for e in logs))
            assert await client.invoke("b2", {"n": 1}) == {"n": 1}  # the workflow's
            assert await client.invoke("b2", {"n": 2}) == {"n": 2}
    said = [e for e in logs if e["event"].startswith("a workflow takes every task of its name")]
    assert len(said) == 1 and said[0]["agents"] == ["b2-server"]
    (serving_said,) = [e for e in logs if e["event"] == "coordinator serving"]
    assert serving_said["workflows"] == ["b2"]  # the start names what it loaded
