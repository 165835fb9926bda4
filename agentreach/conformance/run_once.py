"""Clauses about run-once execution: duplicates, claims left by a crash, a claim held by
another delivery, and the fencing of a late result (§13, §14). Each agent keeps its own
records (``<caller>.<message_id>.<agent_id>``); across agents, the coordinator looks."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from agentreach.broker import ConsumerState, WrongLastSequence, consumer_state, set_ack_wait
from agentreach.conformance.exchange import Exchange
from agentreach.conformance.report import Checks, Failed
from agentreach.conformance.session import Session
from agentreach.conformance.tasks import first, outcome
from agentreach.envelopes import ErrorInfo, Execution, Task, is_expiry_fence, now_ms


async def duplicates(s: Session, c: Checks) -> str:
    """Two deliveries at once and a third after the end: one run, three equal results."""
    task = s.task({"op": "sleep", "ms": 400})
    ex = await s.dispatch(task)
    await s.dispatch(task)
    await _results_of_one_run(s, c, ex, 2)
    await s.dispatch(task)
    await _results_of_one_run(s, c, ex, 3)
    await s.quiet()
    c.must(ex.runs() == 1, f"the handler ran {ex.runs()} times")
    results = [r.result for r in ex.replies_of("result")]
    c.must(all(r == results[0] for r in results), f"results differ: {results}")
    record = await s.execution(task)
    c.must(record is not None and record.state == "done", f"execution record {record}")
    return "three deliveries, one run, the same result three times"


async def takeover(s: Session, c: Checks) -> str:
    """Its own claim left by an earlier process (a crash) is taken at once, as is a lapsed
    one, and the next attempt runs over a failed one (a retry) — also over the coordinator's
    fence record of an earlier attempt (the next attempt came back to this agent), a
    ``failed`` one that kept its claim's live lease and has no finishing time (§13). The
    attempt a failed record is of is not run again: its failure is reported again."""
    epoch = (await s.card()).epoch
    live = _record(s.agent_id, epoch, now_ms() + 120_000)
    cases = {
        "an earlier process's live claim": _record(s.agent_id, epoch - 1, now_ms() + 120_000),
        "a lapsed claim": _record(s.agent_id, epoch, now_ms() - 1_000),
        "a failed run": _record(s.agent_id, epoch, 0, state="failed"),
        "a fence record": msgspec.structs.replace(live, state="failed", error=FENCE),
    }
    for what, held in cases.items():
        attempt = held.attempt + (held.state == "failed")  # the next attempt over a failed one
        task = msgspec.structs.replace(s.task({"op": "echo", "value": what}), attempt=attempt)
        await (await s.executions()).create(s.execution_key(task), _keyed(held, task))
        ex = await s.dispatch(task)
        result = await _result(s, ex, 5.0, f"result despite {what}")
        c.must(result == {"value": what, "attempt": attempt}, f"{what}: result {result!r}")
        record = await s.execution(task)
        c.must(
            record is not None and (record.state, record.epoch) == ("done", epoch),
            f"{what}: record {record}",
        )
    await _failed_not_run_again(s, c, epoch)
    return "runs at once over " + ", ".join(cases) + "; not over its own attempt's failure"


async def _failed_not_run_again(s: Session, c: Checks, epoch: int) -> None:
    """§13 (revision 30): a delivery of the attempt its record says failed (the ack of the
    failure's report was lost; the server delivered it again) is not run: the failure is
    reported again, from the record."""
    held = _record(s.agent_id, epoch, 0, state="failed")
    task = s.task({"op": "sleep", "ms": 10})  # a run says `started`
    await (await s.executions()).create(s.execution_key(task), _keyed(held, task))
    ex = await s.dispatch(task)

    def answered() -> object:
        return first(ex.events_of("failed")) or first(ex.replies_of("result"))

    await s.until(answered, 5.0, "failed reported again")
    await s.quiet()
    c.must(ex.runs() == 0, f"ran an attempt its record says failed: {ex.runs()} runs")
    c.must(not ex.replies_of("result"), "a result for an attempt its record says failed")
    failed = first(ex.events_of("failed"))
    error = failed.detail.get("error") if failed else None
    said = error.get("message") if isinstance(error, dict) else None
    c.must(said == "an earlier attempt", f"the failure reported again is not the record's: {error}")
    record = await s.execution(task)
    c.must(record is not None and record.state == "failed", f"record overwritten: {record}")


async def busy(s: Session, c: Checks) -> str:
    """A second delivery of a message while the first runs (both in hand in one process)
    waits for the first's claim, not run over it; when the first ends, its recorded result
    answers both. (A claim of this process that no delivery in hand holds — its write
    landed, its answer was lost — may be taken over at once, §13: so the kit holds the
    claim with a real delivery, not with a record it writes.)"""
    task = s.task({"op": "sleep", "ms": 3_000})
    ex = await s.dispatch(task)
    await s.until(lambda: ex.runs() or None, 5.0, "the first delivery's start")
    await s.dispatch(task)
    await s.quiet(1.0)
    c.must(ex.runs() == 1, "ran a message another delivery holds")
    c.must(not ex.replies_of("result"), f"answered before the other delivery finished: {ex.said()}")
    await _results(s, ex, 2, 10.0)
    await s.quiet()
    c.must(ex.runs() == 1, f"ran it after all: {ex.runs()} runs")
    results = [r.result for r in ex.replies_of("result")]
    c.must(all(r == results[0] for r in results), f"results differ: {results}")
    epoch = (await s.card()).epoch
    record = await s.execution(task)
    c.must(
        record is not None and (record.state, record.epoch) == ("done", epoch),
        f"execution record {record}",
    )
    await _redelivered_past_its_ttl(s, c)
    kept = await _kept_alive(s, c)
    return (
        "waited while another delivery held the claim, then answered from its record; so did"
        f" a redelivery past the ttl; {kept}"
    )


async def _kept_alive(s: Session, c: Checks) -> str:
    """§10.7 (SHOULD): a run longer than the ack wait keeps its message with *in progress*
    every ack wait / 2, so the server does not deliver it again while it runs (the sender
    would get a second ``ack``, and the delivery would count towards ``max_deliver``)."""
    stream, durable = s.names.dispatch_stream("P1"), s.names.agent_consumer(s.agent_id, "P1")
    before = await consumer_state(s.broker, stream, durable)
    if before is None:
        raise Failed(f"no consumer {durable} on {stream}")
    ack_wait_s = before.spec.ack_wait_s
    if ack_wait_s > KEEP_ALIVE_LOOKED_AT_UP_TO_S:
        return f"the keep-alive not looked at (an ack wait of {ack_wait_s:g} s)"
    run_ms = round(ack_wait_s * 2_200)
    ex = await s.dispatch(s.task({"op": "sleep", "ms": run_ms}, ttl_ms=run_ms + 30_000))
    await _results(s, ex, 1, run_ms / 1000 + 10.0)
    after = await consumer_state(s.broker, stream, durable)
    deliveries = after.deliveries - before.deliveries if after is not None else 0
    c.should(
        deliveries == 1,
        f"a run of {run_ms} ms was delivered {deliveries} times (ack wait {ack_wait_s:g} s):"
        " no in progress (+WPI) every ack wait / 2 while the handler ran (§10.7)",
    )
    acks = len(ex.replies_of("ack"))
    c.should(acks == 1, f"{acks} acks for one run of {run_ms} ms (§10.7)")
    return f"a run of {run_ms} ms watched for redeliveries (ack wait {ack_wait_s:g} s)"


async def _redelivered_past_its_ttl(s: Session, c: Checks) -> None:
    """§10.4 (revision 25): the server delivers a message again, past its ttl, while this
    process still runs it (its keep-alives did not reach a server that was away; here the kit
    shortens the consumer's ack wait): the redelivery waits for that run, not reported
    ``expired`` — a task that then completes."""
    task = s.task({"op": "sleep", "ms": 2_500}, ttl_ms=800)
    stream = s.names.dispatch_stream(task.priority)
    durable = s.names.agent_consumer(s.agent_id, task.priority)
    before = await consumer_state(s.broker, stream, durable)
    if before is None:
        raise Failed(f"no consumer {durable} on {stream}")
    ex = await s.dispatch(task)
    await s.until(lambda: ex.runs() or None, 5.0, "the handler start")
    delivered = await consumer_state(s.broker, stream, durable)
    # The redelivery must come past the ttl: its remaining moments are let pass first.
    await asyncio.sleep(max(0.0, ex.sent_at + task.ttl_ms / 1000 - s.now()))
    # Shorter than the agent's keep-alive (every half ack wait), which would renew it.
    redeliver_after_s = min(REDELIVER_AFTER_S, before.spec.ack_wait_s / 4)
    await set_ack_wait(s.broker, stream, durable, redeliver_after_s)
    try:
        again = await s.poll(lambda: _delivered_after(s, stream, durable, delivered), 5.0)
    finally:
        await set_ack_wait(s.broker, stream, durable, before.spec.ack_wait_s)
    c.must(again is not None, f"not delivered again after an ack wait of {redeliver_after_s:g} s")
    await _results(s, ex, 1, 10.0)
    # The redelivery's answer may follow the run's by the agent's poll for the claim.
    with contextlib.suppress(Failed):
        await _results(s, ex, 2, 5.0)
    await s.quiet()
    c.must(
        not ex.events_of("expired"),
        "reported expired a redelivery past the ttl of a run still in hand (§10.4)",
    )
    c.must(ex.runs() == 1, f"ran the redelivery: {ex.runs()} runs")
    results = [r.result for r in ex.replies_of("result")]
    c.must(len(results) >= 2, "the redelivery got no answer from the run's outcome")
    c.must(all(r == results[0] for r in results), f"results differ: {results}")


async def _delivered_after(
    s: Session, stream: str, durable: str, earlier: ConsumerState | None
) -> bool | None:
    """Whether the consumer delivered anything since ``earlier``."""
    state = await consumer_state(s.broker, stream, durable)
    seen = earlier.deliveries if earlier is not None else 0
    return True if state is not None and state.deliveries > seen else None


async def fencing(s: Session, c: Checks) -> str:
    """§14: a result whose claim was taken away is not sent: late_result_rejected instead."""
    epoch = (await s.card()).epoch
    task = s.task({"op": "sleep", "ms": 1_500})
    ex = await s.dispatch(task)
    await s.until(lambda: ex.runs() or None, 5.0, "the handler start")
    executions = await s.executions()
    key = s.execution_key(task)
    for _ in range(5):  # a lease renewal may slip in between the read and the write
        entry = await executions.get(key)
        c.must(entry is not None, "no claim in reach_executions while the handler runs")
        assert entry is not None
        claim = entry.value
        c.must(claim.state == "running", f"record while running: {claim}")
        c.must((claim.agent_id, claim.epoch) == (s.agent_id, epoch), f"claim {claim}")
        c.must(claim.lease_until_ms > now_ms(), f"the claim's lease has lapsed: {claim}")
        # As the coordinator fences (§13): the lease and finished_at_ms 0 are kept.
        fenced = _keyed(claim, task, state="failed", error=FENCE)
        try:
            await executions.update(key, fenced, last=entry.revision)
            break
        except WrongLastSequence:
            continue
    rejected = await s.until(
        lambda: first(ex.events_of("late_result_rejected")), 8.0, "late_result_rejected event"
    )
    c.must(rejected.agent_id == s.agent_id, f"late_result_rejected names {rejected.agent_id!r}")
    await s.quiet()
    c.must(not ex.replies_of("result"), "the fenced result was sent")
    c.must(not ex.events_of("completed"), "completed was published for a fenced result")
    after = await s.execution(task)
    c.must(after is not None and after.state == "failed", f"the fence was overwritten: {after}")
    return "late result not sent; late_result_rejected published"


async def expiry_fence(s: Session, c: Checks) -> str:
    """§13: a task whose attempt was ended as expired (its expiry fence in the agent's record:
    the coordinator's pass found it past its ttl by its clock) is not run, though by the
    agent's clock it has ttl left; the agent reports it expired, and the fence stands. Nor
    is an attempt the coordinator moved to another agent (its reassignment fence: the agent
    fetched it from its queue as it was moved): not run; reported as ``failed`` with the
    fence's error (SHOULD, since revision 39: a move cut short after its fence is sent on
    from that report), or not at all (an agent of an earlier revision)."""
    task = s.task({"op": "echo", "value": "ended"}, ttl_ms=60_000)
    message = f"ttl 60000 ms passed in the queue of {s.agent_id}, which did not take it"
    error = ErrorInfo(type="expired", message=message, retryable=False)
    fence = Execution(
        message_id=task.message_id,
        state="failed",
        agent_id=s.agent_id,
        error=error,
        finished_at_ms=now_ms(),
    )
    await (await s.executions()).create(s.execution_key(task), fence)
    ex = await s.dispatch(task)
    try:
        detail = await outcome(s, ex, "expired", 10.0, at_once=False)
    except Failed as exc:
        if ex.events_of("expired"):
            raise  # one came, and was wrong: the failure says how
        raise Failed(f"{exc}; instead: {await _over_the_fence(s, ex)}") from None
    c.must(detail.error.type == "expired", f"error.type {detail.error.type!r}")
    await s.quiet()
    c.must(ex.runs() == 0 and not ex.replies_of("result"), "ran a task ended as expired")
    after = await s.execution(task)
    c.must(after is not None and after.state == "failed", f"the fence was overwritten: {after}")
    moved = s.task({"op": "echo", "value": "moved"}, ttl_ms=60_000)
    fence = Execution(
        message_id=moved.message_id,
        state="failed",
        agent_id=s.agent_id,
        error=FENCE,
        finished_at_ms=now_ms(),
    )
    await (await s.executions()).create(s.execution_key(moved), fence)
    ex = await s.dispatch(moved)
    await s.quiet()
    c.must(ex.runs() == 0 and not ex.replies_of("result"), "ran an attempt moved elsewhere")
    said = [e for e in ("completed", "expired") if ex.events_of(e)]
    c.must(not said, f"reported an attempt moved elsewhere as {said}")
    errors = [(e.detail.get("error") or {}).get("type") for e in ex.events_of("failed")]
    c.must(
        all(kind == "reassigned" for kind in errors),
        f"reported an attempt moved elsewhere as failed with error.type {errors}, not the"
        " fence's 'reassigned'",
    )
    after = await s.execution(moved)
    c.must(after is not None and after.error == FENCE, f"the fence was overwritten: {after}")
    return "not run over the expiry fence (expired reported) nor the reassignment fence"


async def _over_the_fence(s: Session, ex: Exchange) -> str:
    """What the kit saw of a task dispatched over its expiry fence, when no ``expired``
    came: whether the agent took it from its queue, ran it, said anything, and what became
    of the fence (an `echo`: its runs show as results, not as `started` notes)."""
    stream = s.names.dispatch_stream(ex.task.priority)
    durable = s.names.agent_consumer(s.agent_id, ex.task.priority)
    state = await consumer_state(s.broker, stream, durable)
    if state is None or state.delivered_seq < ex.seqs[-1]:
        seen = ["the agent did not take the task from its queue"]
    elif ex.replies_of("result"):
        seen = ["the handler ran it (a result was sent)"]
    else:
        seen = ["the agent took it from its queue, and sent no result"]
    said = [e for e in ("accepted", "completed", "failed") if ex.events_of(e)]
    seen.append(f"it published {', '.join(said)}" if said else "it published no event of it")
    record = await s.execution(ex.task)
    if record is None:
        seen.append("its record was deleted")
    elif is_expiry_fence(record, ex.task.attempt):
        seen.append("the fence stands")
    else:
        why = f", error {record.error.type}" if record.error else ""
        seen.append(
            f"the fence was overwritten: the record is now {record.state}, epoch"
            f" {record.epoch}{why} (§13: no claim over the expiry fence of its attempt)"
        )
    return "; ".join(seen)


KEEP_ALIVE_LOOKED_AT_UP_TO_S = 10.0  # a run of 2.2 ack waits; longer ones take too long
REDELIVER_AFTER_S = 1.0  # the ack wait that has the server deliver a running message again
# The error of the coordinator's fence record (coordinator/liveness/reassign.py).
FENCE = ErrorInfo(type="reassigned", message="its agent went OFFLINE", retryable=True)


def _record(agent_id: str, epoch: int, lease_until_ms: int, state: str = "running") -> Execution:
    return Execution(
        message_id="-",
        state=state,  # type: ignore[arg-type]
        agent_id=agent_id,
        epoch=max(0, epoch),
        lease_until_ms=lease_until_ms,
        error=ErrorInfo(type="Error", message="an earlier attempt") if state == "failed" else None,
        finished_at_ms=now_ms() if state != "running" else 0,
    )


def _keyed(record: Execution, task: Task, **changes: object) -> Execution:
    """``record`` as the agent's of ``task``, in the same life of the message."""
    return msgspec.structs.replace(
        record, message_id=task.message_id, received_ms=task.received_ms, **changes
    )


async def _result(s: Session, ex: Exchange, timeout_s: float, what: str) -> object:
    reply = await s.until(lambda: first(ex.replies_of("result")), timeout_s, what)
    return reply.result


async def _results_of_one_run(s: Session, c: Checks, ex: Exchange, count: int) -> None:
    """``count`` result replies within 10 s; missing ones are put down to a handler that
    ran more than once when it did (a second run that lost its finishing write to the
    first may say nothing at all)."""
    try:
        await _results(s, ex, count, 10.0)
    except Failed:
        c.must(ex.runs() == 1, f"the handler ran {ex.runs()} times")
        raise


async def _results(s: Session, ex: Exchange, count: int, timeout_s: float) -> None:
    await s.until(
        lambda: True if len(ex.replies_of("result")) >= count else None,
        timeout_s,
        f"{count} result replies",
    )
