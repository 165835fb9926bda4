"""Clause 10: a task whose ttl passes while it waits behind the agent's busy handler (§10.4)."""

from __future__ import annotations

import msgspec

from agentreach.broker import consumer_state
from agentreach.conformance.exchange import Exchange
from agentreach.conformance.report import Checks, Unjudged
from agentreach.conformance.session import Session
from agentreach.conformance.tasks import first, outcome

MAX_FILL = 64  # slots the kit fills to hold a task in the agent's queue
SHORT_MS = 600  # the tasks that fill the handler's places, in the first round
LONG_MS = 3_000  # … in the second, where a task held for a place must not wait for one
EXPIRED_WITHIN_S = 2.0  # a held task with a ttl of 100 ms is said expired within this


async def expired(s: Session, c: Checks) -> str:
    """§10.4: a task whose ttl passed in the queue is not run, and is reported expired; one
    done already, sent again past its ttl, is answered from its record. A task the agent
    took from its queue and holds for a place expires at its ttl, not once a place frees."""
    intent = (await s.card()).intents.get(s.topic)
    capacity = intent.capacity if intent is not None else 1
    if capacity > MAX_FILL:
        raise Unjudged(
            f"capacity {capacity} on {s.topic}: the kit fills at most {MAX_FILL} places;"
            f" declare at most {MAX_FILL} there to have this clause judged"
        )
    done = s.task({"op": "sleep", "ms": 1}, priority="P2")
    ran = await s.dispatch(done)
    await s.until(lambda: first(ran.replies_of("result")), 10.0, "the first task's result")
    blockers = await _fill(s, capacity, SHORT_MS)
    ex = await s.dispatch(s.task({"op": "sleep", "ms": 10}, ttl_ms=100, priority="P2"))
    # As a redelivery whose ack a failover lost comes back: its record answers, not expired.
    await s.dispatch(msgspec.structs.replace(done, ttl_ms=100))
    detail = await outcome(s, ex, "expired", 10.0)
    c.must(detail.error.type == "expired", f"error.type {detail.error.type!r}")
    c.must(not detail.error.retryable, "expired is not retryable")
    await s.quiet()
    c.must(ex.runs() == 0 and not ex.replies_of("result"), "the handler ran")
    c.should(not ex.replies_of("ack"), "no ack for a task not taken")
    await _results(s, blockers)
    await s.until(
        lambda: True if len(ran.replies_of("result")) >= 2 or ran.events_of("expired") else None,
        5.0,
        "the result of a task done already, sent again past its ttl, from its record (§10.4)",
    )
    c.must(
        not ran.events_of("expired"),
        "reported expired a task done already, sent again past its ttl (§10.4: its record answers)",
    )
    c.must(ran.runs() == 1, f"ran a task done already again: {ran.runs()} runs")
    held = await _held_for_a_place(s, c, capacity)
    return (
        f"expired after waiting behind {capacity} running tasks, not run; one done already"
        f" answered from its record; {held}"
    )


async def _held_for_a_place(s: Session, c: Checks, capacity: int) -> str:
    """Revision 7: a task the agent holds while it waits for a place expires at its ttl (its
    sender waited minutes for a handler). One left in the queue (an agent that pulls only
    for its free places, §6) is not the agent's to end: the coordinator's pass may end it."""
    blockers = await _fill(s, capacity, LONG_MS)
    ex = await s.dispatch(s.task({"op": "sleep", "ms": 10}, ttl_ms=100, priority="P2"))
    sent = s.now()
    if not await _taken_from_its_queue(s, ex):
        await _results(s, blockers)
        return "a task behind busy places is left in its queue (pulled for free places only)"
    await outcome(s, ex, "expired", 10.0)
    took = s.now() - sent
    c.must(
        took < EXPIRED_WITHIN_S,
        f"expired {took:.1f} s after its 0.1 s ttl, held for a place, as one freed",
    )
    await _results(s, blockers)
    return f"one held for a place expired {took:.1f} s after its 0.1 s ttl"


async def _fill(s: Session, capacity: int, sleep_ms: int) -> list[Exchange]:
    """The handler's places, filled at P2, so a task surely waits behind them (in its queue,
    or in hand for a place) until its ttl has passed. §6: P2 may leave the last place to P0."""
    blockers = [
        await s.dispatch(s.task({"op": "sleep", "ms": sleep_ms}, priority="P2"))
        for _ in range(capacity)
    ]
    busy = capacity - 1 if capacity > 1 else 1

    def filled() -> bool | None:
        return sum(1 for b in blockers if b.runs()) >= busy or None

    await s.until(filled, 10.0, "every place busy")
    return blockers


async def _results(s: Session, blockers: list[Exchange]) -> None:
    await s.until(
        lambda: all(b.replies_of("result") for b in blockers) or None, 10.0, "the blockers' results"
    )


async def _taken_from_its_queue(s: Session, ex: Exchange) -> bool:
    """Whether the agent's consumer delivered ``ex``'s dispatch within a second."""
    stream = s.names.dispatch_stream(ex.task.priority)
    durable = s.names.agent_consumer(s.agent_id, ex.task.priority)

    async def delivered() -> bool | None:
        state = await consumer_state(s.broker, stream, durable)
        return True if state is not None and state.delivered_seq >= ex.seqs[-1] else None

    return bool(await s.poll(delivered, 1.0))
