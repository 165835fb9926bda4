"""Large payloads through the Object Store (claim check), audit records of finished
messages, and the W3C traceparent carried to every hop."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from agentreach.agents import Agent, ReachClient, Rejected, TaskContext
from agentreach.broker import read_stream
from agentreach.broker.lifecycle import emit, event_for
from agentreach.cli.trace import collect, render
from agentreach.envelopes import AuditRecord, Task, decode_as, decode_task
from agentreach.envelopes import headers as h
from tests.secured import SECURED
from tests.support import until_true

BIG = "x" * 300_000  # over the 256 KiB threshold, under NATS's 1 MiB
# The role templates grant no Object Store access: object names and the chunk consumers
# nats-py makes cannot be scoped to one party, so a secured server has no claim check yet.
NO_CLAIM_CHECK = pytest.mark.skipif(
    SECURED, reason="claim check is not available on a secured server (README: Securing)"
)


def mirror() -> Agent:
    agent = Agent("claim-mirror", startup_delay=0)

    @agent.handler("mirror", capacity=4)
    async def echo(ctx: TaskContext, payload: dict) -> dict:
        return {"length": len(payload["text"]), "text": payload["text"], "tp": ctx.traceparent}

    @agent.handler("inflate", capacity=4)
    async def inflate(ctx: TaskContext, payload: dict) -> str:
        return "x" * payload["size"]

    @agent.handler("fan", capacity=4)
    async def fan(ctx: TaskContext, payload: dict) -> dict:
        child = ctx.child_task("mirror", {"text": "small"})
        return {"child_traceparent": child.traceparent, "mine": ctx.traceparent}

    return agent


@NO_CLAIM_CHECK
async def test_another_large_payload_under_a_used_id_leaves_the_first_one_s(
    broker, coordinator, watcher
):
    """The same id sent again with another large payload is refused, and the first task,
    still queued, runs with its own bytes (the second's did not replace them in the store)."""
    running, release = asyncio.Event(), asyncio.Event()
    agent = Agent("claim-holder", startup_delay=0)

    @agent.handler("hold", capacity=1)
    async def hold(ctx: TaskContext, payload: dict) -> dict:
        if payload["text"] == "block":
            running.set()
            await release.wait()
        return {"head": payload["text"][:1], "length": len(payload["text"])}

    async with agent.running(broker=broker), ReachClient(broker=broker) as client:
        blocker = asyncio.create_task(client.invoke("hold", {"text": "block"}))
        await running.wait()  # its one slot is taken: the large task waits in its queue
        first = asyncio.create_task(
            client.invoke("hold", {"text": "a" * 300_000}, message_id="big-7")
        )
        await watcher.event("routed", message_id="big-7")
        with pytest.raises(Rejected) as refused:
            await client.invoke("hold", {"text": "b" * 300_000}, message_id="big-7")
        release.set()
        assert await first == {"head": "a", "length": 300_000}
        await blocker
    assert "which had another payload" in str(refused.value)


@NO_CLAIM_CHECK
async def test_large_payloads_and_results_travel_by_reference(broker, coordinator, watcher):
    """A 300 KB payload and result go through the Object Store: the handler and the caller
    see the values, the wire carries references."""
    async with mirror().running(broker=broker), ReachClient(broker=broker) as client:
        result = await client.invoke("mirror", {"text": BIG}, execute_deadline_ms=10_000)
        completed = await watcher.event("completed", topic="mirror")
    assert result["length"] == len(BIG) and result["text"] == BIG
    assert "result" not in completed.detail
    ref = completed.detail["result_ref"]
    assert ref["bucket"] == broker.names.payloads_bucket and ref["size"] > 300_000
    routed = await watcher.event("routed", topic="mirror")
    assert routed.detail["input"]["bytes"] > 300_000
    stowed = routed.detail["input"]
    assert stowed["ref"]["name"] == f"{routed.message_id}/payload-{stowed['sha256'][:16]}"
    shown = render(completed.trace_id, await collect(broker, completed.trace_id))
    line = next(line for line in shown.splitlines() if " completed " in line)
    assert f"result in the object store: {ref['bucket']}/{ref['name']}" in line


@NO_CLAIM_CHECK
async def test_a_large_nats_pub_body_is_claim_checked_at_intake(broker, coordinator, watcher):
    """A bare body over the threshold is stowed by intake, so the agent's queue holds a
    reference; the agent still gets the whole payload."""
    body = msgspec.json.encode({"text": BIG})
    async with mirror().running(broker=broker):
        await broker.publish(broker.names.task("mirror"), body, headers={h.MSG_ID: "big-pub"})
        completed = await watcher.event("completed", message_id="big-pub", timeout=20)
    assert completed.detail["result_ref"]["size"] > 300_000


@NO_CLAIM_CHECK
async def test_a_call_whose_result_is_claim_checked_is_answered_with_it(broker, coordinator):
    """``reach.call`` fetches a result kept in the Object Store and answers with it (its
    answer used to be cancelled with the call's reply box while it was fetched)."""
    body = msgspec.json.encode({"text": BIG})
    async with mirror().running(broker=broker):
        answer = await broker.nc.request(broker.names.call("mirror"), body, timeout=20)
    assert answer.headers is not None and answer.headers[h.KIND] == "result"
    assert msgspec.json.decode(answer.data)["text"] == BIG


@NO_CLAIM_CHECK
async def test_a_call_whose_result_is_larger_than_a_message_is_told_so(broker, coordinator):
    """A result over the server's max_payload cannot be the call's answer: the call is told
    the task completed and where to read it, at once, not left to time out (and be sent
    again under a new id, its work run twice)."""
    size = broker.max_payload + 1000
    body = msgspec.json.encode({"size": size})
    headers = {h.MSG_ID: "too-big-call"}
    async with mirror().running(broker=broker):
        answer = await broker.nc.request(broker.names.call("inflate"), body, 20, headers=headers)
    assert answer.headers is not None and answer.headers[h.KIND] == "error"
    assert answer.headers[h.MESSAGE_ID] == "too-big-call"
    error = msgspec.json.decode(answer.data)["error"]
    assert error["type"] == "answer_too_large" and error["retryable"] is False
    assert error["message"].startswith(f"the task completed, but its result ({size + 2} bytes")
    assert "'too-big-call'" in error["message"]


async def test_every_finished_message_has_one_audit_record(broker, coordinator, watcher):
    """A completed and a dead-lettered message each get one compact record in REACH_AUDIT:
    stages, durations, input and output summaries, status."""
    names = broker.names
    async with mirror().running(broker=broker), ReachClient(broker=broker) as client:
        await client.invoke("mirror", {"text": "hello"}, trace_id="audited")
        lost, _ = await client.publish("nobody_serves", {"a": 1})
        await watcher.dead_letter("no_route", message_id=lost)

        async def records() -> list[AuditRecord] | None:
            stored = await read_stream(broker, names.audit_stream, names.audit_wildcard)
            found = [decode_as(m.data, AuditRecord) for m in stored]
            return found if len(found) >= 2 else None

        found = await until_true(records)
    done = next(r for r in found if r.status == "completed")
    assert done.trace_id == "audited" and done.topic == "mirror"
    assert [s.event for s in done.stages] == ["routed", "accepted", "completed"]
    assert done.agents == ["claim-mirror"] and done.attempts == 1
    assert done.durations.total >= done.durations.executing > 0
    assert done.input is not None and done.input.preview == '{"text":"hello"}'
    assert done.output is not None and '"length":5' in done.output.preview
    letter = next(r for r in found if r.status == "dead_lettered")
    assert letter.reason == "no_route" and letter.message_id == lost
    assert letter.error is not None and letter.error.type == "no_route"
    assert letter.input is not None and letter.input.bytes == len('{"a":1}')
    assert len(found) == 2  # one each, no duplicates


async def test_traceparent_is_accepted_and_carried_to_every_hop(broker, coordinator, watcher):
    """A `traceparent` header on intake: the trace id becomes the Reach trace id, the agent
    sees a traceparent of the same trace, and a child task carries it on."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    header = f"00-{trace}-00f067aa0ba902b7-01"
    sub = await broker.subscribe(broker.names.dispatch("claim-mirror", "P1"))
    async with mirror().running(broker=broker):
        await broker.publish(
            broker.names.task("fan"), b"{}", headers={h.MSG_ID: "traced-1", "traceparent": header}
        )
        completed = await watcher.event("completed", message_id="traced-1")
        dispatched = await sub.next(timeout_s=5)
    await sub.close()
    assert completed.trace_id == trace  # `reach trace <W3C trace id>` finds it
    mine = completed.detail["result"]["mine"]
    child = completed.detail["result"]["child_traceparent"]
    assert mine.split("-")[1] == trace and mine != header  # the dispatch is its own hop
    assert child.split("-")[1] == trace and child != mine
    task = decode_task(dispatched.data)
    assert task.traceparent == mine and dispatched.headers["traceparent"] == mine
    assert task.received_ms > 0


async def test_an_ending_stored_before_its_routed_event_is_recorded_once_routing_shows(
    broker, coordinator, watcher
):
    """In a cluster the dispatch (and the agent's answer) may be stored before the `routed`
    event: the audit writer looks again before it calls the ending unrouted."""
    names = broker.names
    task = Task(v=1, message_id="late-routed", trace_id="late-trace", topic="mirror")
    completed = event_for(task, "completed", agent_id="worker-late", result={"ok": True})
    await emit(broker, completed, sender="worker-late")

    async def looked_again() -> bool:
        info = await broker.js.consumer_info(names.events_stream, names.coordinator_audit)
        return (info.num_redelivered or 0) >= 1

    await until_true(looked_again)  # its first look found no routing
    await emit(broker, event_for(task, "routed", agent_id="worker-late"))

    async def record() -> AuditRecord | None:
        of_task = names.audit_of_message(task.message_id)
        stored = await read_stream(broker, names.audit_stream, of_task)
        return decode_as(stored[0].data, AuditRecord) if stored else None

    found = await until_true(record)
    assert found.agents == ["worker-late"] and found.status == "completed"
    assert [s.event for s in found.stages] == ["completed", "routed"]  # as stored
    assert not [e for e in watcher.events if e.event == "alert"]


def timed() -> Agent:
    agent = Agent("audit-timing", startup_delay=0)
    tries: dict[str, int] = {}

    @agent.handler("flaky", capacity=4, max_attempts=3)
    async def flaky(ctx: TaskContext, payload: dict) -> dict:
        tries[payload["key"]] = tries.get(payload["key"], 0) + 1
        await asyncio.sleep(0.05)
        if tries[payload["key"]] <= payload["fails"]:
            raise RuntimeError("not yet")
        return {"ok": True}

    @agent.handler("slow", capacity=1)
    async def slow(ctx: TaskContext, payload: dict) -> dict:
        await asyncio.sleep(payload["s"])
        return {"ok": True}

    return agent


async def test_audit_durations_add_up_to_the_total(broker, coordinator):
    """Intake, queued, executing and retry_wait add up to the total for a task retried to
    completion, one whose retries ran out, and one that expired in the agent's queue (whose
    time there is queued, not lost)."""
    names = broker.names

    async def record(message_id: str) -> AuditRecord | None:
        stored = await read_stream(broker, names.audit_stream, names.audit_of_message(message_id))
        return decode_as(stored[0].data, AuditRecord) if stored else None

    async with timed().running(broker=broker), ReachClient(broker=broker) as client:
        retried, _ = await client.publish("flaky", {"key": "a", "fails": 2})
        exhausted, _ = await client.publish("flaky", {"key": "b", "fails": 3})
        await client.publish("slow", {"s": 1.2})  # holds the only slot
        await asyncio.sleep(0.1)
        expired, _ = await client.publish("slow", {"s": 0}, ttl_ms=400)
        found = {m: await until_true(lambda m=m: record(m)) for m in (retried, exhausted, expired)}
    for r in found.values():
        d = r.durations
        assert d.intake + d.queued + d.executing + d.retry_wait == pytest.approx(d.total, abs=0.01)
    assert found[retried].status == "completed" and found[retried].attempts == 3
    assert found[exhausted].reason == "retries_exhausted" and found[exhausted].durations.retry_wait
    late = found[expired]
    assert late.reason == "expired" and late.durations.executing == 0
    # Waited behind the 1.2 s task until its 400 ms ttl ran out, not until that task ended.
    assert 200 < late.durations.queued < 1_100
