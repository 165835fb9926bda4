"""Bad input ends in the dead-letter stream with its reason, never in a loop or a crash."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext, TaskFailed
from agentreach.broker import ConsumerSpec, Provisioner, Topology, bind, read_stream
from agentreach.broker.lifecycle import emit, event_for
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.consumption import POISON_AFTER, Consumption
from agentreach.coordinator.routing.router import Router
from agentreach.envelopes import Event, Task
from agentreach.envelopes import headers as h
from tests.e2e.routing_support import fast, serving
from tests.secured import operators_reply_to
from tests.support import echoing, until_true

# An event as a party sends it carries headers (one with none is a server's answer).
AS_SENT = {"Nats-Msg-Id": "as-sent"}


def echo_agent() -> Agent:
    agent = Agent("echo-bad-input", startup_delay=0)

    @agent.handler("echo")
    async def echo(ctx: TaskContext, payload: object) -> object:
        return payload

    return agent


async def test_deeply_nested_json_is_dead_lettered_not_retried(broker, coordinator, watcher):
    """JSON nested 10,000 deep is an invalid envelope at once (no RecursionError loop)."""
    body = b"[" * 10_000 + b"]" * 10_000
    await broker.publish(broker.names.task("echo"), body, headers={h.MSG_ID: "deep-1"})
    letter = await watcher.dead_letter("invalid_envelope", message_id="deep-1")
    assert letter.error is not None and "nested too deeply" in letter.error.message

    async def settled() -> bool:  # not left to come back
        info = await broker.js.stream_info(broker.names.tasks_stream)
        return info.state.messages == 0

    await until_true(settled, timeout=5)


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({h.TTL: "5ms"}, "header Reach-TTL"),
        ({h.TTL: "-1"}, "header Reach-TTL"),
        ({h.TTL: "99999999999999999999999"}, "header Reach-TTL"),
        ({h.TTL: "86400001"}, "header Reach-TTL"),
        ({h.REPLY_TO: "{prefix}.dlq.forged.echo"}, "header Reach-Reply-To"),
        ({h.REPLY_TO: "{prefix}.task.echo"}, "header Reach-Reply-To"),
        ({h.REPLY_TO: "{prefix}.agent.echo-bad-input.p1"}, "header Reach-Reply-To"),
        ({h.REPLY_TO: "$JS.API.STREAM.DELETE.{dlq}"}, "header Reach-Reply-To"),
        ({h.REPLY_TO: "a b"}, "header Reach-Reply-To"),
    ],
)
async def test_garbage_headers_are_refused_by_name(broker, coordinator, watcher, headers, named):
    """A bounded ttl, and replies never into our own subjects nor the system's (under this
    run's prefix: against a shared server, `NATS_URL`, each test has its own)."""
    names = broker.names
    headers = {k: v.replace("{prefix}", names.prefix) for k, v in headers.items()}
    headers = {k: v.replace("{dlq}", names.dlq_stream) for k, v in headers.items()}
    message_id = f"garbage-{abs(hash(str(headers)))}"
    forged = await broker.nc.subscribe(f"{names.prefix}.dlq.forged.>")
    await broker.publish(names.task("echo"), b"{}", headers={h.MSG_ID: message_id, **headers})
    letter = await watcher.dead_letter("invalid_envelope", message_id=message_id)
    assert letter.error is not None and f"at `{named}`" in letter.error.message
    with pytest.raises(TimeoutError):  # nothing was sent to the reply subject
        await asyncio.wait_for(forged.next_msg(timeout=0.3), 0.5)
    assert await broker.js.stream_info(broker.names.dlq_stream)  # still there


async def test_a_full_envelope_replying_into_our_namespace_is_refused(broker, coordinator, watcher):
    """The same rule for a full envelope's ``reply_to``, named by its JSON path."""
    task = Task(
        v=1,
        message_id="env-reply",
        trace_id="t",
        topic="echo",
        reply_to=f"{broker.names.prefix}.event.x.y.z.w",
    )
    await broker.publish(broker.names.task("echo"), envelopes.encode(task))
    letter = await watcher.dead_letter("invalid_envelope", message_id="env-reply")
    assert letter.error is not None and "at `$.reply_to`" in letter.error.message


async def test_a_sender_named_by_the_subject_cannot_claim_to_be_another_agent(
    broker, coordinator, watcher
):
    """The subject's sender token is who sent it: a body's ``from_agent`` naming someone
    else gives way (the agent's replies go ``to_agent`` the real sender)."""
    seen: list[str | None] = []
    agent = Agent("echo-from", startup_delay=0)

    @agent.handler("echo")
    async def echo(ctx: TaskContext, payload: object) -> object:
        seen.append(ctx.envelope.from_agent)
        return payload

    task = Task(v=1, message_id="from-1", trace_id="from-1", topic="echo", from_agent="victim")
    async with agent.running(broker=broker):
        await broker.publish(broker.names.task("echo", "alice"), envelopes.encode(task))
        await watcher.event("completed", message_id="from-1")
    assert seen == ["alice"]


def _failed_without_its_task(message_id: str, agent_id: str) -> Event:
    return Event(
        v=1,
        event="failed",
        message_id=message_id,
        trace_id=message_id,
        topic="echo",
        agent_id=agent_id,
        detail={"error": {"type": "Boom", "message": "x", "retryable": True}},
    )


async def test_a_failed_event_without_its_task_is_dead_lettered(broker, coordinator, watcher):
    """A non-Python agent's ``failed`` event lacking ``detail.task`` ends the task it was
    given, naming what is missing."""
    routed = Task(v=1, message_id="no-task-1", trace_id="no-task-1", topic="echo")
    await emit(broker, event_for(routed, "routed", agent_id="ts-agent"))  # as routing does
    subject = broker.names.event("failed", "echo", "no-task-1", "no-task-1", "ts-agent")
    await broker.publish(
        subject,
        envelopes.encode(_failed_without_its_task("no-task-1", "ts-agent")),
        headers=AS_SENT,
    )
    letter = await watcher.dead_letter("invalid_envelope", message_id="no-task-1")
    assert letter.error is not None and "at `$.detail`" in letter.error.message
    assert "`task`" in letter.error.message


async def test_a_failed_event_without_its_task_ends_no_task_its_agent_still_runs(
    broker, coordinator, watcher
):
    """A broken ``failed`` in the name of the agent that runs the task (a buggy agent, or
    anyone on an open server) while the run holds its claim: the coordinator waits for the
    run, which completes; no dead letter (it was ended first, then completed: both)."""
    release = asyncio.Event()
    agent = Agent("slow-bad-input", startup_delay=0)

    @agent.handler("slow")
    async def slow(ctx: TaskContext, payload: object) -> object:
        await release.wait()
        return "done"

    names = broker.names
    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        answer = asyncio.create_task(client.invoke("slow", {}))
        accepted = await watcher.event("accepted", topic="slow")
        sent, runner = accepted.message_id, accepted.agent_id or ""
        broken = _failed_without_its_task(sent, runner)
        broken = msgspec.structs.replace(
            broken, topic="slow", trace_id=accepted.trace_id, caller=accepted.caller
        )
        subject = names.event("failed", "slow", accepted.trace_id, sent, runner)
        await broker.publish(subject, envelopes.encode(broken), headers=AS_SENT)

        async def postponed() -> bool:
            info = await broker.js.consumer_info(names.events_stream, names.coordinator_outcomes)
            return info.num_redelivered > 0

        await until_true(postponed)  # looked at, and put off while the run holds its claim
        release.set()
        assert await answer == "done"

        async def settled() -> bool:
            info = await broker.js.consumer_info(names.events_stream, names.coordinator_outcomes)
            return info.num_ack_pending == 0

        await until_true(settled)
    assert not [e for e in watcher.events if e.event == "dead_lettered" and e.message_id == sent]


async def test_a_broken_outcome_about_a_task_given_to_another_ends_nothing(
    broker, coordinator, watcher
):
    """Without its task no grant can be checked: the routing is. An agent the attempt was
    not routed to raises an alert, and the task is not ended."""
    routed = Task(v=1, message_id="no-task-2", trace_id="no-task-2", topic="echo")
    await emit(broker, event_for(routed, "routed", agent_id="ts-agent"))
    subject = broker.names.event("failed", "echo", "no-task-2", "no-task-2", "intruder")
    await broker.publish(
        subject,
        envelopes.encode(_failed_without_its_task("no-task-2", "intruder")),
        headers=AS_SENT,
    )
    alert = await watcher.event("alert", topic="_agent")
    assert alert.agent_id == "intruder" and alert.detail["message_id"] == "no-task-2"
    assert alert.detail["why"].startswith("the attempt was not routed to it")
    assert not [e for e in watcher.events if e.event == "dead_lettered"]


async def test_a_message_that_keeps_crashing_its_handler_is_dead_lettered_as_poison(
    broker, watcher
):
    """A handler that raises on a message: a few tries, then the message is dead-lettered
    as ``poison`` with the error, and acknowledged."""
    names = broker.names
    spec = ConsumerSpec(
        stream=names.tasks_stream, durable="poison-test", filter_subjects=(names.tasks_wildcard,)
    )
    consumer = await bind(broker, spec)
    tries = 0

    async def crashing(delivery: object) -> float | None:
        nonlocal tries
        tries += 1
        raise ValueError("this input breaks the handler")

    consumption = Consumption(broker, Provisioner(broker, Topology.default(names)))
    runner = asyncio.create_task(consumption.run(consumer, 8, crashing))
    try:
        await broker.publish(names.task("echo"), b'{"x": 1}', headers={h.MSG_ID: "poison-1"})
        letter = await watcher.dead_letter("poison", timeout=20)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    assert tries == POISON_AFTER
    assert letter.error is not None and "ValueError: this input breaks" in letter.error.message
    assert letter.raw == '{"x": 1}'


async def test_a_task_that_keeps_crashing_intake_is_answered_and_in_its_senders_trace(
    broker, coordinator, watcher, monkeypatch
):
    """A task whose intake keeps crashing ends as ``poison``: its sender is answered at
    once, not left to its deadline, and the letter is the task's (its envelope and ids)."""
    routed = Router.dispatch

    async def crashing(self: Router, task: Task, **kwargs: object) -> float | None:
        if task.topic == "explode":
            raise ValueError("this task breaks the router")
        return await routed(self, task, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Router, "dispatch", crashing)
    async with ReachClient(broker=broker) as client:
        with pytest.raises(TaskFailed) as caught:
            await client.invoke("explode", {"n": 1}, ttl_ms=20_000, ack_deadline_ms=15_000)
    assert caught.value.error.type == "poison" and caught.value.ending == "poison"
    assert "ValueError: this task breaks the router" in caught.value.error.message
    letter = await watcher.dead_letter("poison", message_id=caught.value.message_id)
    assert letter.envelope is not None and letter.envelope.payload == {"n": 1}
    assert letter.topic == "explode"


async def test_the_same_task_sent_again_is_answered_again(broker, coordinator, watcher):
    """A full envelope sent twice with the same id (no dedup header): both senders get the
    result; the handler ran once."""
    runs: list[str] = []
    agent = Agent("once-more", startup_delay=0)

    @agent.handler("echo")
    async def echo(ctx: TaskContext, payload: object) -> object:
        runs.append(ctx.message_id)
        return payload

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        results = []
        for n in range(2):
            inbox, replies = operators_reply_to(broker, f"again{n}")
            sub = await broker.nc.subscribe(replies)
            task = client.task("echo", {"n": 1}, message_id="same-id", reply_to=inbox)
            await broker.nc.publish(broker.names.task("echo"), envelopes.encode(task))
            while True:
                reply = envelopes.decode_reply((await sub.next_msg(timeout=10)).data)
                if isinstance(reply, envelopes.Result):
                    results.append(reply.result)
                    break
            await sub.unsubscribe()
    assert results == [{"n": 1}, {"n": 1}]
    assert runs == ["same-id"]


async def test_a_dead_letter_storm_makes_no_consumers(broker, coordinator, watcher):
    """300 bad messages in a burst: each dead letter reads its trace without a consumer,
    and a real task is still served at once."""
    names = broker.names
    before = (await broker.js.account_info()).consumers  # a shared server has others' too
    for i in range(300):
        await broker.publish(names.task("echo"), b"{bad", headers={h.MSG_ID: f"storm-{i}"})
    await watcher.dead_letter("invalid_envelope", message_id="storm-299", timeout=30)
    account = await broker.js.account_info()
    assert account.consumers - before < 20, (before, account.consumers)
    async with echo_agent().running(broker=broker), ReachClient(broker=broker) as client:
        assert await client.invoke("echo", {"ok": True}) == {"ok": True}
    stored = await read_stream(broker, names.dlq_stream, names.dlq("invalid_envelope", "echo"))
    assert len(stored) == 300


async def test_a_message_with_a_status_header_is_served_not_taken_for_a_status(
    broker, coordinator, watcher
):
    """`nats pub -H Status:500` made nats-py take the stored message for a server status
    and stall the consumer; it is an ordinary task."""
    async with echo_agent().running(broker=broker):
        await broker.publish(
            broker.names.task("echo"), b'{"n": 5}', headers={h.MSG_ID: "st-1", "Status": "500"}
        )
        completed = await watcher.event("completed", message_id="st-1")
    assert completed.detail["result"] == {"n": 5}


async def test_a_task_larger_than_the_server_takes_is_rejected_not_retried(
    broker, start_coordinator, watcher
):
    """Without the claim check (a threshold above the server's limit), a body just under
    the max payload grows past it in its envelope: rejected as too_large, its dead letter
    cut down to fit."""
    import msgspec

    from agentreach.coordinator.observability import ClaimCheckConfig
    from tests.conftest import FAST

    no_claim_check = ClaimCheckConfig(threshold_bytes=broker.max_payload * 2)
    config = msgspec.structs.replace(FAST, claim_check=no_claim_check)
    body = b'"' + b"a" * (broker.max_payload - 200) + b'"'
    async with start_coordinator(config), echo_agent().running(broker=broker):
        await broker.publish(broker.names.task("echo"), body, headers={h.MSG_ID: "huge-1"})
        letter = await watcher.dead_letter("rejected", message_id="huge-1", timeout=20)
    assert letter.error is not None and letter.error.type == "too_large"
    assert letter.truncated and letter.envelope is not None and letter.envelope.payload is None


async def test_a_senders_dedup_header_other_than_its_message_id_is_refused(
    broker, coordinator, watcher
):
    """The stream drops a message sent again by its Nats-Msg-Id, the coordinator knows it by
    the body's message_id: a sender's two must be equal, or the message is refused by name
    (answered in its box)."""
    box = broker.names.reply_box("alice", "dedup-box")
    replies = await broker.nc.subscribe(f"{box}.*")
    task = Task(v=1, message_id="hdr-1", trace_id="hdr-1", topic="echo", reply_to=box)
    headers = {h.MSG_ID: "hdr-1-other"}
    await broker.publish(
        broker.names.task("echo", "alice"), envelopes.encode(task), headers=headers
    )
    letter = await watcher.dead_letter("invalid_envelope", message_id="hdr-1-other")
    answer = envelopes.decode_reply((await replies.next_msg(timeout=5)).data)
    assert letter.error is not None and "Nats-Msg-Id 'hdr-1-other'" in letter.error.message
    assert isinstance(answer, envelopes.ErrorReply) and answer.error.type == "invalid_envelope"
    assert answer.reason == "invalid_envelope"


async def test_an_invalid_envelope_is_answered_where_its_body_asks_and_traced_for_its_sender(
    broker, coordinator, watcher
):
    """An envelope that does not decode still names its reply box in its body: the error
    goes there (no Reach-Reply-To header needed), and its sender finds the dead letter's
    event in its own trace."""
    box = broker.names.reply_box("alice", "bad-box")
    replies = await broker.nc.subscribe(f"{box}.*")
    body = b'{"v": 1, "kind": "task", "message_id": "bad-1", "trace_id": "bad-1", "topic": "echo",'
    body += b' "attempt": "one", "reply_to": "' + box.encode() + b'"}'
    await broker.publish(broker.names.task("echo", "alice"), body, headers={h.MSG_ID: "bad-1"})
    await watcher.dead_letter("invalid_envelope", message_id="bad-1")
    answer = envelopes.decode_reply((await replies.next_msg(timeout=5)).data)
    dead = await watcher.event("dead_lettered", message_id="bad-1")
    assert isinstance(answer, envelopes.ErrorReply) and "$.attempt" in answer.error.message
    assert dead.caller == "alice"
    assert answer.attempts == dead.detail["attempts"] == 0  # none began (caller.md §6.2)


async def test_a_senders_intake_time_is_the_brokers_not_its_body_s(
    broker, start_coordinator, watcher
):
    """A full envelope's `received_ms` is the coordinator's to stamp. Set 10 minutes back by
    its sender, the workflow the task started ended at once as expired (its ttl counted
    from then), and the trace showed that time (an outside trial); set ahead, it would have
    bought the workflow a later deadline."""
    flows = {"dated": wf.chain(wf.step("a", "dated-step"))}
    task = Task(
        v=1, message_id="dated-1", trace_id="dated-1", topic="dated", payload={"n": 1},
        ttl_ms=60_000, received_ms=envelopes.now_ms() - 600_000,
    )  # fmt: skip
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, echoing("dated-echo", "dated-step")),
    ):
        await broker.publish(broker.names.task("dated", "alice"), envelopes.encode(task))
        completed = await watcher.event("workflow_completed", message_id="dated-1")
    assert completed.detail["workflow"] == "dated"


async def test_a_task_on_a_subject_of_too_many_tokens_is_in_its_sender_s_trace(
    broker, coordinator, watcher
):
    """`reach.task.echo.extra.bob` is refused as `invalid_envelope` (its topic `echo.extra`
    is no token), and the refusal names `bob`, the subject's last token, as its caller:
    bob's trace request finds it. Its caller was none, and bob's own message read as
    another caller's (`others`: an outside caller trial)."""
    task = Task(v=1, message_id="too-many-1", trace_id="too-many-1", topic="echo")
    subject = broker.names.task("echo.extra", "bob")
    await broker.publish(subject, envelopes.encode(task), headers=h.task_headers(task))
    refused = await watcher.dead_letter("invalid_envelope", message_id="too-many-1")
    asked = envelopes.encode(envelopes.TraceRequest(message_id="too-many-1"))
    answer = await broker.request(broker.names.trace_request("bob"), asked, timeout=5)
    reply = envelopes.decode_as(answer.data, envelopes.TraceReply)
    assert refused.error is not None and "subject topic" in refused.error.message
    assert not reply.others and [e.event for e in reply.events] == ["dead_lettered"]
    assert reply.events[0].caller == "bob"


async def test_an_envelope_without_its_kind_is_dead_lettered_not_run_as_a_payload(
    broker, coordinator, watcher
):
    """A hand-made envelope that forgot `"kind": "task"` ran as a bare body: the whole of it
    the payload, its ttl, ids and reply_to unread, its sender waiting for nothing (an
    outside caller trial). It is refused as `invalid_envelope`, naming `kind`."""
    async with echoing("echo-kindless", "echo").running(broker=broker):
        body = {"v": 1, "message_id": "kindless-1", "trace_id": "kindless-1", "topic": "echo"}
        await broker.publish(
            broker.names.task("echo", "alice"),
            envelopes.encode(body),
            headers={h.MSG_ID: "kindless-1"},
        )
        letter = await watcher.dead_letter("invalid_envelope", message_id="kindless-1")
    assert letter.error is not None and "missing required field `kind`" in letter.error.message
    assert not [e for e in watcher.events if e.event == "routed"]
