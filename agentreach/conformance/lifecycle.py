"""Clauses that start, crash and stop the agent's process (§3, §13, §16): they need the
agent's command (``reach conformance ID -- COMMAND …``)."""

from __future__ import annotations

import asyncio
import contextlib

from agentreach.broker import BrokerTimeout, BucketWatch, NoResponders, consumer_state
from agentreach.broker.presence import ask
from agentreach.conformance.exchange import Exchange
from agentreach.conformance.report import Checks, Failed, Skipped, Unjudged
from agentreach.conformance.run_once import _result
from agentreach.conformance.session import Session
from agentreach.envelopes import PRIORITIES, AgentCard, Heartbeat, Liveness, decode_as, now_ms

START_S = 60.0  # for the agent's process to register (and any startup delay of its own)
TWIN_S = 20.0
STOP_S = 20.0


def process_of(s: Session):  # type: ignore[no-untyped-def]
    if s.process is None:
        raise Skipped("needs the agent's command: reach conformance ID -- COMMAND …")
    return s.process


async def started(s: Session, *, after_epoch: int) -> AgentCard:
    """Until the agent's process serves: a running card with a newer epoch and a heartbeat
    of that epoch (written once its consumers are bound)."""
    beats_from = len(s.beats)
    card: AgentCard = await s.until(
        lambda: next(
            (
                seen.body
                for seen in reversed(s.cards)
                if isinstance(seen.body, AgentCard)
                and seen.body.status == "running"
                and seen.body.epoch > after_epoch
            ),
            None,
        ),
        START_S,
        f"running card with an epoch above {after_epoch}",
    )
    await s.until(
        lambda: next(
            (
                True
                for seen in s.beats[beats_from:]
                if isinstance(seen.body, Heartbeat) and seen.body.epoch == card.epoch
            ),
            None,
        ),
        START_S,
        f"heartbeat of epoch {card.epoch}",
    )
    return card


async def one_process(s: Session, c: Checks) -> str:
    """§3: a second process with the same id refuses to start; the first serves on."""
    process = process_of(s)
    before = await s.card()
    code = await process.twin(TWIN_S)
    c.must(code is not None, f"a second process of the id still ran after {TWIN_S:g} s")
    c.must(code != 0, "a second process of the id exited 0 (it should fail, saying why)")
    after = await s.card()
    c.must(after.epoch == before.epoch, f"the second process registered (epoch {after.epoch})")
    await ask(s.broker, s.names.presence(s.agent_id), 3.0)
    return f"the second process exited {code}; epoch {after.epoch} serves on"


async def crash(s: Session, c: Checks) -> str:
    """§13, §14: killed mid-run and restarted, the agent (a new epoch) runs the redelivered
    message at once over its earlier process's claim; the result is recorded once."""
    process = process_of(s)
    before = await s.card()
    state = await consumer_state(
        s.broker, s.names.dispatch_stream("P1"), s.names.agent_consumer(s.agent_id, "P1")
    )
    ack_wait_s = state.spec.ack_wait_s if state else 30.0
    if ack_wait_s > 60:
        raise Unjudged(
            f"the consumer's ack wait is {ack_wait_s:g} s: too long to wait for; at most 60 s"
            " has this clause judged"
        )
    ex = await s.dispatch(s.task({"op": "sleep", "ms": 3_000}))
    await s.until(lambda: ex.runs() or None, 5.0, "the handler start")
    await process.kill()
    await process.start()
    card = await started(s, after_epoch=before.epoch)
    c.must(card.epoch == before.epoch + 1, f"epoch {before.epoch} → {card.epoch}")
    restarted = s.now()
    try:
        result = await _result(s, ex, ack_wait_s + 15.0, "result after the restart")
    except Failed as exc:
        raise Failed(f"{exc}; {await _why_no_result(s, ex, card.epoch, ack_wait_s)}") from None
    took = s.now() - restarted
    c.must(result == {"slept_ms": 3_000}, f"result {result!r}")
    await s.quiet()
    c.must(ex.runs() == 2, f"{ex.runs()} runs: killed mid-run, it must run again, once")
    record = await s.execution(ex.task)
    c.must(
        record is not None and (record.state, record.epoch) == ("done", card.epoch),
        f"record {record}",
    )
    c.should(took <= ack_wait_s + 3 + 5, f"waited {took:.1f} s: the old claim was waited out")
    return (
        f"epoch {card.epoch} ran it again {took:.1f} s after the restart (ack wait {ack_wait_s:g})"
    )


async def _why_no_result(s: Session, ex: Exchange, epoch: int, ack_wait_s: float) -> str:
    """The likely cause of a crashed task's missing result after the restart (process of
    ``epoch``), from its record and the agent's events."""
    record = await s.execution(ex.task)
    again = [e for e in ex.events_of("accepted") if e.detail.get("epoch") == epoch]
    taken = (
        f"epoch {epoch} accepted the redelivery"
        if again
        else f"no accepted of epoch {epoch}: was the message delivered again (ack wait"
        f" {ack_wait_s:g} s)?"
    )
    if record is not None and record.state == "running" and record.epoch < epoch:
        left_s = (record.lease_until_ms - now_ms()) / 1000
        lease = f"its lease runs {left_s:.1f} s more" if left_s > 0 else "its lease has run out"
        return (
            f"{taken}; the record is still epoch {record.epoch}'s running claim ({lease})."
            " Likely cause: the new process does not take over its earlier epoch's running"
            " claim at once (§13's claim table: a running record of a lower epoch is replaced;"
            " §19 names it the most common pitfall), and waits out that claim's lease instead"
        )
    if record is None:
        return f"{taken}; the agent has no record of the task"
    return (
        f"{taken}; the record is {record.state}, epoch {record.epoch}; the handler started"
        f" {ex.runs()} times in all"
    )


async def graceful_stop(s: Session, c: Checks) -> str:
    """§16: SIGTERM lets the running task finish, marks the card stopped, deletes the
    heartbeat and leaves the consumers; then nothing answers presence."""
    process = process_of(s)
    before = await s.card()
    ex = await s.dispatch(s.task({"op": "sleep", "ms": 800}))
    await s.until(lambda: ex.runs() or None, 5.0, "the handler start")
    s.expect_exit = True
    seen: list[str] = []  # the card's statuses during the stop
    async with BucketWatch(await s.broker.kv(s.names.agents_bucket)) as cards:
        follow = asyncio.create_task(_follow_card(cards, s.agent_id, seen))
        code = await process.stop(STOP_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(follow, 5.0)  # until it reads `stopped`
    c.must(code is not None, f"still running {STOP_S:g} s after SIGTERM")
    c.should(code == 0, f"exit code {code} after SIGTERM")
    c.must(bool(ex.replies_of("result")), "the running task was not finished before exit")
    c.should(
        "draining" in seen,
        "the card was not marked draining while the handler ran (§16 step 2): what waits in"
        " its queues waits for the whole drain",
    )
    card = await s.card()
    c.must((card.status, card.epoch) == ("stopped", before.epoch), f"card {card.status}")
    beats = await s.broker.bucket(s.names.heartbeats_bucket, Heartbeat)
    c.must(await beats.get(s.agent_id) is None, "the heartbeat was not deleted")
    for priority in PRIORITIES:
        durable = s.names.agent_consumer(s.agent_id, priority)
        kept = await consumer_state(s.broker, s.names.dispatch_stream(priority), durable)
        c.must(kept is not None, f"consumer {durable} was deleted")
    try:
        await ask(s.broker, s.names.presence(s.agent_id), 1.0)
        raise Failed("presence still answered after the process exited")
    except NoResponders:
        pass
    except BrokerTimeout:
        c.should(False, "presence: no responders once stopped (a subscriber stayed)")
    verdicts = await s.broker.bucket(s.names.liveness_bucket, Liveness)

    async def offline() -> Liveness | None:
        entry = await verdicts.get(s.agent_id)
        stopped = entry is not None and (entry.value.state, entry.value.reason) == (
            "OFFLINE",
            "stopped",
        )
        return entry.value if stopped and entry else None

    c.should(await s.poll(offline, 5.0) is not None, "the coordinator records OFFLINE, stopped")
    return f"drained, card stopped, heartbeat deleted, exit {code}"


async def _follow_card(cards: BucketWatch, agent_id: str, seen: list[str]) -> None:
    """Note each status the agent's card is written with, until ``stopped``."""
    async for change in cards:
        if change.key == agent_id and change.value is not None:
            seen.append(decode_as(change.value, AgentCard).status)
            if seen[-1] == "stopped":
                return
