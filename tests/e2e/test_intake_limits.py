"""What intake keeps of what it cannot take: an invalid body is dead-lettered cut down, and a
large body whose claim check keeps failing ends in a dead letter instead of coming back."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, StreamFull, Topology, provision, read_stream
from agentreach.broker.dead_letters import RAW_KEPT
from agentreach.broker.limits import StorageLimits
from agentreach.cli.retirement import forget
from agentreach.coordinator import Coordinator, DeliveryConfig
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.intake import STOW_TRIES
from agentreach.envelopes import DeadLetter, Task, encode, now_ms
from agentreach.envelopes import headers as h
from tests.e2e.routing_support import fast, serving, worker
from tests.secured import SECURED
from tests.support import Watcher, eventually, until_true


async def test_a_large_invalid_body_is_dead_lettered_cut_down(broker, coordinator, watcher):
    """900 KB of malformed JSON leaves a letter with its first 64 Ki characters, marked
    truncated, not the whole body for the dead letters' 30 days."""
    body = b"{not json " + b"q" * 900_000
    await broker.publish(broker.names.task("summarize"), body, headers={h.MSG_ID: "bad-big"})
    letter = await watcher.dead_letter("invalid_envelope", message_id="bad-big")
    assert letter.truncated
    assert letter.raw is not None and letter.raw == body[:RAW_KEPT].decode()

    async def stored() -> list[int] | None:
        # A subscriber hears a letter as the stream takes it, maybe before it is stored.
        return [len(m.data) for m in await read_stream(broker, broker.names.dlq_stream, ">")]

    sizes = await until_true(stored, timeout=5)
    assert max(sizes) < 2 * RAW_KEPT


@pytest.mark.skipif(SECURED, reason="a secured deployment has no claim check")
async def test_a_claim_check_that_keeps_failing_ends_in_a_dead_letter(broker, coordinator, watcher):
    """With the payload store gone, a 300 KB `nats pub` body is tried STOW_TRIES times,
    then dead-lettered as rejected with the reason, never routed."""
    await broker.js.delete_stream(f"OBJ_{broker.names.payloads_bucket}")
    body = msgspec.json.encode({"text": "x" * 300_000})
    await broker.publish(broker.names.task("mirror"), body, headers={h.MSG_ID: "unstowed"})
    letter = await watcher.dead_letter("rejected", message_id="unstowed", timeout=30)
    assert letter.error is not None and letter.error.type == "claim_check_failed"
    assert f"{STOW_TRIES} tries" in letter.error.message
    assert "does not exist" in letter.error.message
    assert watcher.count("routed", {"unstowed"}) == 0


async def fill_dead_letters(broker) -> None:  # type: ignore[no-untyped-def]
    """REACH_DLQ (at 4 KiB) filled by letters nobody dealt with, to its last bytes."""
    for size in (600, 40):
        with pytest.raises(StreamFull):
            for n in range(200):
                filler, msg_id = broker.names.dlq("expired", "t"), f"old-{size}-{n}"
                await broker.publish(filler, b"a" * size, headers={h.MSG_ID: msg_id})


async def test_a_letter_that_waited_for_room_says_why_the_task_ended(
    broker, start_coordinator, watcher
):
    """`no_route` tasks held while REACH_DLQ was full were lettered `expired` once there was
    room (their ttl had passed meanwhile), under traces that said `no_route`: a compensation
    worker for `no_route` never saw them (an on-call drill). The letter says what the stored
    `dead_lettered` event said."""
    names = broker.names
    full = StorageLimits(dead_letters_bytes=4_096)
    await provision(broker, Topology.default(names, limits=full))
    async with start_coordinator(fast(limits=full)):
        await fill_dead_letters(broker)
        task = Task(v=1, message_id="nobody-1", trace_id="nobody-1", topic="nobody", ttl_ms=200)
        await broker.publish(names.task("nobody"), encode(task), headers={h.MSG_ID: "nobody-1"})
        ended = await watcher.event("dead_lettered", message_id="nobody-1")
        assert ended.detail["reason"] == "no_route"
        await eventually(lambda: now_ms() > ended.received_ms + 400)  # its ttl passed waiting
        await provision(broker, Topology.default(names, limits=StorageLimits()))  # room

        async def stored() -> list[str] | None:
            letters = await read_stream(broker, names.dlq_stream, names.dlq("*", "nobody"))
            return [m.subject for m in letters] or None

        # The watcher sees each letter published, stored or refused: the stream is read.
        assert await until_true(stored) == [names.dlq("no_route", "nobody")]


async def test_a_task_whose_letter_was_refused_is_not_decided_again_when_it_comes_back(
    broker, start_coordinator, watcher
):
    """A task dead-lettered while REACH_DLQ was full (its event stored, its letter refused)
    was decided again when its message came back: routed to an agent that had come
    meanwhile, and completed; it ended twice (an on-call re-drill). It ends as its stored
    event says, its letter stored once there is room, and no agent runs it."""
    names = broker.names
    full = StorageLimits(dead_letters_bytes=4_096)
    await provision(broker, Topology.default(names, limits=full))
    async with start_coordinator(fast(limits=full)) as coordinator:
        await fill_dead_letters(broker)
        task = Task(v=1, message_id="late-1", trace_id="late-1", topic="late", ttl_ms=60_000)
        await broker.publish(names.task("late"), encode(task), headers={h.MSG_ID: "late-1"})
        ended = await watcher.event("dead_lettered", message_id="late-1")
        assert ended.detail["reason"] == "no_route"  # nobody served `late` then
        ran: Counter[str] = Counter()
        agent = worker("late-1", ran, topics=("late",))
        letter = await _back_then_room(broker, coordinator, watcher, agent, "late-1")
    assert letter.reason == "no_route" and not ran
    assert not {"routed", "completed"} & {
        e.event for e in watcher.events if e.message_id == "late-1"
    }


async def test_a_retry_whose_letter_was_refused_is_not_decided_again_when_it_comes_back(
    broker, start_coordinator, watcher
):
    """The same as a retry: refused as its agent went away (`rejected` as every breaker was
    open, in the re-drill; `no_route` here), its letter refused by a full REACH_DLQ, the
    failure it retries came back and was decided again, routed as a breaker's trial call,
    and completed: ended twice. It ends as its stored event says."""
    names = broker.names
    full = StorageLimits(dead_letters_bytes=4_096)
    slow_retries = DeliveryConfig(base_s=5.0, cap_s=5.0)  # time to forget its agent
    await provision(broker, Topology.default(names, limits=full))
    async with start_coordinator(fast(limits=full, delivery=slow_retries)) as coordinator:
        await fill_dead_letters(broker)
        failing = Agent("shaky-1", startup_delay=0)

        @failing.handler("shaky")
        async def fail(ctx: TaskContext, payload: Any) -> Any:
            raise RuntimeError("try again")

        async with serving(broker, coordinator, failing):
            task = Task(v=1, message_id="shaky-t", trace_id="shaky-t", topic="shaky")
            await broker.publish(names.task("shaky"), encode(task), headers={h.MSG_ID: "shaky-t"})
            await watcher.event("failed", message_id="shaky-t")
        await forget(broker, "shaky-1")  # nobody serves `shaky` when its retry is decided
        ended = await watcher.event("dead_lettered", message_id="shaky-t", timeout=20)
        assert (ended.attempt, ended.detail["reason"]) == (2, "no_route")
        ran: Counter[str] = Counter()
        agent = worker("shaky-2", ran, topics=("shaky",))
        letter = await _back_then_room(broker, coordinator, watcher, agent, "shaky-t")
    assert letter.attempts == 1 and not ran
    kinds = [e.event for e in watcher.events if e.message_id == "shaky-t"]
    assert "completed" not in kinds and kinds.count("routed") == 1


async def test_a_letter_a_full_dead_letter_stream_refuses_waits_for_room(
    broker, start_coordinator, watcher
):
    """With REACH_DLQ at its byte limit, an invalid task's letter cannot be stored: its
    message stays and comes back, the coordinator says once that a stream is full (naming
    it), and the letter is stored once there is room; nothing is lost."""
    names = broker.names
    full = StorageLimits(dead_letters_bytes=4_096)
    # An operator's (a secured coordinator may not change the history streams' limits).
    await provision(broker, Topology.default(names, limits=full))
    with capture_logs() as logs:
        async with start_coordinator(fast(limits=full)):
            await fill_dead_letters(broker)
            await broker.publish(names.task("summarize"), b"{oops", headers={h.MSG_ID: "waits"})
            await eventually(lambda: any(e["event"].startswith("a stream is full") for e in logs))
            await provision(broker, Topology.default(names, limits=StorageLimits()))  # room
            letter = await watcher.dead_letter("invalid_envelope", message_id="waits")
    said = [e for e in logs if e["event"].startswith("a stream is full")]
    assert len(said) == 1 and names.dlq("invalid_envelope", "summarize") in said[0]["error"]
    assert letter.error is not None and "malformed" in letter.error.message


async def test_a_workflow_a_full_workflow_stream_holds_back_runs_once_there_is_room(
    broker, start_coordinator
):
    """With REACH_WORKFLOWS at its byte limit (`workflows_bytes`; here smaller than one
    message), a workflow cannot store its deadline's timer: its task waits, the coordinator
    says which stream is full, and the workflow runs, once, when there is room."""
    names = broker.names
    full = StorageLimits(workflows_bytes=200)
    flows = {"one-step": wf.chain(wf.step("only", "late"))}
    await provision(broker, Topology.default(names, limits=full))
    ran: Counter[str] = Counter()
    with capture_logs() as logs:
        async with (
            start_coordinator(fast(limits=full, workflows=flows)) as coordinator,
            serving(broker, coordinator, worker("stepper", ran, topics=("late",))),
            ReachClient(broker=broker) as client,
        ):
            started = asyncio.ensure_future(client.invoke("one-step", {}, ttl_ms=60_000))
            await eventually(lambda: _full_said(logs))
            assert not started.done() and not ran
            await provision(broker, Topology.default(names, limits=StorageLimits()))  # room
            result = await asyncio.wait_for(started, 30)
    assert names.workflow_timer("") in _full_said(logs)[0]["error"]
    assert result == {"by": "stepper"} and ran["stepper"] == 1


def _full_said(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"].startswith("a stream is full")]


async def _back_then_room(
    broker: Broker, coordinator: Coordinator, watcher: Watcher, agent: Agent, message_id: str
) -> DeadLetter:
    """With ``agent`` serving the topic now, ``message_id`` comes back while REACH_DLQ is
    full: it is dead-lettered again (its stored decision stands), not routed (decided
    again); then there is room, and its `no_route` letter is stored."""
    async with serving(broker, coordinator, agent):
        seen = len(watcher.events)

        def came_back() -> str | None:
            mine = [e for e in watcher.events[seen:] if e.message_id == message_id]
            return next((e.event for e in mine if e.event in ("dead_lettered", "routed")), None)

        assert await watcher.until(came_back, "its return") == "dead_lettered"
        await provision(broker, Topology.default(broker.names, limits=StorageLimits()))  # room
        return await watcher.dead_letter("no_route", message_id=message_id)
