"""Calls (core request/reply on ``reach.call.<topic>``) answered with the task's result."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter

from agentreach import envelopes
from agentreach.agents import Agent, TaskContext
from agentreach.broker import Broker
from agentreach.broker.endings import Sent
from agentreach.broker.lifecycle import events_of_id
from agentreach.broker.reply_box import ReplyBox
from agentreach.coordinator import Coordinator
from agentreach.coordinator.call_bodies import Addressed, addressed
from agentreach.coordinator.calls import _Requester, _Waiting
from agentreach.envelopes import headers as h
from tests.conftest import FAST
from tests.e2e.test_invoke_across_restarts import Gate
from tests.support import eventually, until_true


def sleeper() -> Agent:
    agent = Agent("call-sleeper", startup_delay=0)

    @agent.handler("nap")
    async def nap(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(payload["s"])  # the work outlasts the call's ttl
        return {"slept": payload["s"]}

    return agent


async def test_a_call_whose_task_runs_past_its_ttl_gets_the_result(broker, coordinator):
    """The ttl bounds how long a task may wait to start; once an agent accepted it, the call
    waits for its execute budget, and answers with the result, not `no_result`."""
    async with sleeper().running(broker=broker):
        answer = await broker.nc.request(
            broker.names.call("nap"), b'{"s": 1.5}', timeout=10, headers={h.TTL: "300"}
        )
    assert answer.headers is not None and answer.headers.get(h.KIND) == "result"
    assert envelopes.decode_json(answer.data) == {"slept": 1.5}


async def test_a_call_with_a_full_envelope_is_answered_with_its_task_s_end(broker, coordinator):
    """A call whose body is a whole envelope is answered through the box the gateway gave it
    (its ``reply_to`` rewritten): here the task's own verdict, once its handler was cut at
    the envelope's execute budget and its ttl had passed, rather than the gateway's silence."""
    task = envelopes.Task(
        v=1,
        message_id=envelopes.new_id(),
        trace_id=envelopes.new_id(),
        topic="nap",
        payload={"s": 10},  # longer than the budget: the handler is cut at 1.5 s
        ttl_ms=300,
        budget=envelopes.Budget(execute_ms=1500),
    )
    async with sleeper().running(broker=broker):
        answer = await broker.nc.request(
            broker.names.call("nap"), envelopes.encode(task), timeout=10
        )
    assert answer.headers is not None and answer.headers.get(h.KIND) == "error"
    failure = envelopes.decode_json(answer.data)
    assert failure["error"]["type"] == "expired"
    assert failure["reason"] == "expired"  # how the message ended: its dead letter's reason


async def test_a_call_sent_again_with_its_id_is_answered_with_the_first_result(broker, coordinator):
    """The stream drops a call's task sent again within its duplicate window; the gateway
    answers the second call from the first one's end instead of timing out."""
    headers = {h.MSG_ID: "call-again-1"}
    async with sleeper().running(broker=broker):
        calls = [
            broker.nc.request(broker.names.call("nap"), b'{"s": 0.3}', timeout=10, headers=headers)
            for _ in range(2)
        ]
        answers = await asyncio.gather(*calls)
    for answer in answers:
        assert answer.headers is not None and answer.headers.get(h.KIND) == "result"
        assert envelopes.decode_json(answer.data) == {"slept": 0.3}


async def test_a_call_of_another_request_under_an_id_it_used_is_refused(broker, coordinator):
    """The same id with another body: not answered with the first body's result."""
    headers = {h.MSG_ID: "call-reused-1"}
    async with sleeper().running(broker=broker):
        first = await broker.nc.request(
            broker.names.call("nap"), b'{"s": 0.01}', timeout=10, headers=headers
        )
        again = await broker.nc.request(
            broker.names.call("nap"), b'{"s": 0.02}', timeout=5, headers=headers
        )
    assert envelopes.decode_json(first.data) == {"slept": 0.01}
    assert again.headers is not None and again.headers.get(h.KIND) == "error"
    failure = envelopes.decode_json(again.data)
    assert failure["error"]["type"] == failure["reason"] == "duplicate_id"
    assert "which had another payload" in failure["error"]["message"]


async def test_a_call_under_another_caller_s_message_id_is_refused_at_once(broker, coordinator):
    """billing's message id sent again by mallory: the stream drops it as a duplicate, and
    the gateway answers mallory at once that the id is taken, not with billing's result
    (nor after the ttl)."""
    headers = {h.MSG_ID: "billing-msg-1"}
    names = broker.names
    async with sleeper().running(broker=broker):
        first = await broker.nc.request(
            names.call("nap", "billing"), b'{"s": 0.01}', timeout=10, headers=headers
        )
        again = await broker.nc.request(
            names.call("nap", "mallory"), b'{"s": 0.01}', timeout=3, headers=headers
        )
    assert envelopes.decode_json(first.data) == {"slept": 0.01}
    assert again.headers is not None and again.headers.get(h.KIND) == "error"
    failure = envelopes.decode_json(again.data)
    error = failure["error"]
    assert error["type"] == "duplicate_id" and failure["reason"] == "duplicate_id"
    assert "'billing-msg-1' is another caller's message" in error["message"]


async def test_a_resend_is_judged_against_the_caller_s_own_run_of_the_id(broker, coordinator):
    """billing used an id; past the duplicate window mallory ran one of her own under it,
    and her resend was refused as "an earlier request of yours, which had another payload",
    naming a digest of billing's payload (a security walkthrough). It is her own run's."""
    window_s = 0.5  # the intake's duplicate window, made short (120 s by default)
    intake = await broker.js.stream_info(broker.names.tasks_stream)
    intake.config.duplicate_window = window_s
    await broker.js.update_stream(intake.config)
    headers = {h.MSG_ID: "shared-1"}
    names = broker.names
    async with sleeper().running(broker=broker):
        await broker.nc.request(
            names.call("nap", "billing"), b'{"s": 0.01}', timeout=10, headers=headers
        )
        await asyncio.sleep(window_s * 2)  # the window passes: a time, not an event
        own = await broker.nc.request(
            names.call("nap", "mallory"), b'{"s": 0.02}', timeout=10, headers=headers
        )
        again = await broker.nc.request(
            names.call("nap", "mallory"), b'{"s": 0.02}', timeout=10, headers=headers
        )
    assert envelopes.decode_json(own.data) == {"slept": 0.02}
    assert again.headers is not None and again.headers.get(h.KIND) == "result", again.data
    assert envelopes.decode_json(again.data) == {"slept": 0.02}


async def test_a_call_under_an_operator_s_message_id_is_refused_at_once(broker, coordinator):
    """A message of no caller (an operator's bare form) is not mallory's either."""
    headers = {h.MSG_ID: "operator-msg-1"}
    names = broker.names
    async with sleeper().running(broker=broker):
        await broker.nc.request(names.call("nap"), b'{"s": 0.01}', timeout=10, headers=headers)
        again = await broker.nc.request(
            names.call("nap", "mallory"), b'{"s": 0.01}', timeout=3, headers=headers
        )
    assert envelopes.decode_json(again.data)["error"]["type"] == "duplicate_id"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_call_s_body_is_read_once_for_its_reply_address_its_id_ttl_and_budget():
    """A whole envelope is readdressed and keeps its own id, ttl and execute budget (intake
    refuses a Nats-Msg-Id other than the id); a bare, malformed or oddly shaped body gets
    the defaults, and only an envelope is rewritten."""
    task = envelopes.Task(
        v=1,
        message_id="m-1",
        trace_id="t-1",
        topic="nap",
        ttl_ms=4000,
        budget=envelopes.Budget(execute_ms=1500),
    )
    call = addressed(envelopes.encode(task), "reach.reply.c.box")
    assert (call.execute_ms, call.message_id, call.ttl_ms) == (1500, "m-1", 4000)
    assert envelopes.decode_task(call.data).reply_to == "reach.reply.c.box"
    assert call.sha256 == envelopes.summarize(None).sha256  # the payload's, as routed says
    default = envelopes.Budget().execute_ms
    bare = b'{"s":  1}'
    assert addressed(bare, "box") == Addressed(bare, default, sha256=sha256(b'{"s":1}'))
    assert addressed(b"not json", "box") == Addressed(b"not json", default)
    odd = b'{"v": 1, "kind": "task", "budget": [1500], "ttl_ms": "x", "message_id": 7}'
    assert addressed(odd, "box").execute_ms == default
    assert (addressed(odd, "box").ttl_ms, addressed(odd, "box").message_id) == (None, None)


async def test_a_callers_call_with_a_full_envelope_and_no_msg_id_is_known_by_its_own_id(
    broker, coordinator
):
    """``reach.call.<topic>.<caller>`` with a whole envelope and no Nats-Msg-Id: the task is
    taken in under the envelope's id (a made-up header would be refused), and sent again it
    is answered with the first result."""
    task = envelopes.Task(v=1, message_id="own-id-1", trace_id="t", topic="nap", payload={"s": 0})
    async with sleeper().running(broker=broker):
        subject = broker.names.call("nap", "alice")
        first = await broker.nc.request(subject, envelopes.encode(task), timeout=10)
        again = await broker.nc.request(subject, envelopes.encode(task), timeout=10)
    said = {h.KIND: "result", h.MESSAGE_ID: "own-id-1"}  # to look the task up by
    assert first.headers == said and again.headers == said
    assert envelopes.decode_json(again.data) == envelopes.decode_json(first.data)


async def test_a_call_takes_its_answer_only_from_the_announced_agent(broker, coordinator):
    """Another party that learns a call's box (here: from the stored task) and answers in it
    first, in its own name or in the announced agent's, is not heard: the requester gets
    the result of the agent the coordinator routed the task to."""
    names = broker.names
    started, release = asyncio.Event(), asyncio.Event()
    agent = Agent("call-honest", startup_delay=0)

    @agent.handler("slow_echo")
    async def slow_echo(ctx: TaskContext, payload: dict) -> dict:
        started.set()
        await release.wait()
        return {"echo": payload}

    boxes: list[str] = []

    async def seen(msg) -> None:  # type: ignore[no-untyped-def]
        boxes.append((msg.headers or {}).get(h.REPLY_TO, ""))  # the body is a bare payload

    tap = await broker.nc.subscribe(names.tasks_wildcard, cb=seen)
    async with agent.running(broker=broker):
        calling = asyncio.create_task(
            broker.nc.request(names.call("slow_echo"), b'{"n": 1}', timeout=10)
        )
        await started.wait()
        [box] = boxes
        for sender, claimed in (("forger", "forger"), ("forger", "call-honest")):
            forged = envelopes.Result(
                v=1,
                message_id="x",
                trace_id="x",
                topic="slow_echo",
                from_agent=claimed,
                result={"forged": True},
            )
            await broker.nc.publish(f"{box}.{sender}", envelopes.encode(forged))
        await broker.nc.flush()
        release.set()
        answer = await calling
    await tap.unsubscribe()
    assert envelopes.decode_json(answer.data) == {"echo": {"n": 1}}
    assert box.startswith(names.reply_box("coordinator", "call"))
    assert len(box.rpartition(".")[2]) > 30  # not a counter anybody could guess


async def test_a_call_whose_id_header_is_not_its_envelope_s_id_is_refused_at_once(
    broker, coordinator
):
    """Intake would refuse it; sent again under the header's id, each call was a duplicate
    that waited its whole ttl (a day, at most) for an end the message never had: a caller
    piled them up by the thousand, each with a subscription and a read a second."""
    task = envelopes.Task(
        v=1, message_id="own-id-1", trace_id="own-id-1", topic="nap", payload={}, ttl_ms=60_000
    )
    for _ in range(3):
        answer = await broker.nc.request(
            broker.names.call("nap", "mallory"),
            envelopes.encode(task),
            timeout=5,
            headers={h.MSG_ID: "x"},
        )
        assert answer.headers is not None and answer.headers.get(h.KIND) == "error"
        failure = envelopes.decode_json(answer.data)
        assert failure["error"]["type"] == "invalid_envelope", failure
        assert failure["reason"] == "invalid_envelope"
        assert "is not the message_id 'own-id-1'" in failure["error"]["message"]
        assert answer.headers.get(h.MESSAGE_ID) == "own-id-1"  # the id it would be known by
    assert not coordinator._calls._waiting


async def test_a_call_given_up_says_whether_and_by_whom_its_task_was_accepted(broker, coordinator):
    """The wait lasts the later of the ttl and the execute budget from the latest ack: a
    call given up says whether an agent had accepted the task (an agent then stalled), the
    coordinator had (a workflow, or a person's review: a trial's caller was told an agent
    had), or none had (nobody took it)."""
    calls = coordinator._calls
    answers = []
    for n, (by, ttl_ms) in enumerate([(None, 6_000), ("worker-1", 6_000), ("", 0)]):
        box = broker.names.reply_box("test", f"call-{n}")
        inbox = await broker.nc.subscribe(box)
        requester = _Requester(box, f"id-{n}")
        timer = asyncio.get_running_loop().call_later(3600, lambda: None)
        replies = await broker.subscribe(box + ".*", lambda msg: asyncio.sleep(0))
        await broker.flush()  # the coordinator answers on a connection of its own
        key = f"key-{n}"
        asked = (None, f"id-{n}", Sent("nap", None))  # no events: nothing ended it
        box = ReplyBox(broker.names, "test", key)
        reconnects = broker.reconnects
        calls._waiting[key] = _Waiting(requester, timer, box, replies, 500, asked, reconnects, by)
        calls._give_up(key, ttl_ms)
        answer = await inbox.next_msg(timeout=5)
        answers.append(envelopes.decode_json(answer.data)["error"]["message"])
        assert answer.headers.get(h.MESSAGE_ID) == f"id-{n}"
    assert answers == [
        "no result within the task's ttl (6000 ms); no agent accepted it",
        "no result within the task's ttl (6000 ms), though agent worker-1 accepted it",
        "no result within its execute budget (500 ms) after the coordinator acknowledged it: a"
        " workflow started, or it waits for a person in manual review (its trace tells which,"
        " and how it ends)",
    ]


async def test_calls_sent_again_share_one_read_of_the_first_one_s_end(broker, coordinator):
    """Each call sent again under an id waits for the first one's end: by one read of its
    events for them all, and with no reply box of its own (nobody answers there)."""
    headers = {h.MSG_ID: "call-again-2"}
    call = broker.names.call("nap")
    calls = coordinator._calls

    def request():  # type: ignore[no-untyped-def]
        return asyncio.ensure_future(
            broker.nc.request(call, b'{"s": 1.5}', timeout=10, headers=headers)
        )

    async with sleeper().running(broker=broker):
        first = request()
        await eventually(lambda: calls._waiting)
        again = [request() for _ in range(4)]
        await eventually(lambda: [len(keys) for keys in calls._earlier.values()] == [4])
        answers = await asyncio.gather(first, *again)
    for answer in answers:
        assert envelopes.decode_json(answer.data) == {"slept": 1.5}
    assert not calls._earlier and not calls._waiting


async def test_a_result_sent_while_the_call_s_coordinator_was_away_is_answered_once_back(broker):
    """A call's result is a core reply: sent while the coordinator that took the call was
    away (its link down, a server restarting), it is gone, and the call said `no_result` at
    the end of the execute budget of a task that had completed (a fresh reader: 3 of 3,
    killing the server). Back, the coordinator reads the task's events and answers."""
    runs, release = Counter[str](), asyncio.Event()
    agent = Agent("call-slowpoke", startup_delay=0)

    @agent.handler("slow")
    async def slow(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        await release.wait()
        return {"n": payload["n"]}

    port = int(broker.url.rsplit(":", 1)[1])
    async with (
        Gate(port) as relay,
        Broker(relay.url, names=broker.names, name="coordinator", wait=True) as own,
        Coordinator(own, FAST).running(),
        agent.running(broker=broker),
    ):
        call = broker.names.call("slow")
        answering = asyncio.create_task(broker.nc.request(call, b'{"n": 7}', timeout=60))
        await eventually(lambda: len(runs) == 1, 10)
        await relay.shut()  # the coordinator is away from here until the result is sent
        release.set()
        [message_id] = runs

        async def completed() -> bool:
            return any(e.event == "completed" for e in await events_of_id(broker, message_id))

        await until_true(completed, timeout=10, every_s=0.1)
        reconnects = own.reconnects
        await relay.open()
        await eventually(lambda: own.reconnects > reconnects, 15)
        async with asyncio.timeout(5):  # not at the end of its execute budget (30 s)
            answer = await answering
    assert answer.headers is not None and answer.headers.get(h.KIND) == "result"
    assert envelopes.decode_json(answer.data) == {"n": 7}
    assert runs[message_id] == 1
