"""Clauses about the task loop: accept, progress, result, errors, deadline, expiry, refusals."""

from __future__ import annotations

from typing import Any

import msgspec

from agentreach.broker import read_stream
from agentreach.conformance.exchange import Exchange, Seen
from agentreach.conformance.report import Checks, Failed, Skipped
from agentreach.conformance.session import CALLER, Session
from agentreach.envelopes import (
    AGENT_EVENTS,
    Budget,
    DecodeError,
    Event,
    decode_detail,
    decode_stored_event,
    new_id,
    now_ms,
)
from agentreach.envelopes import headers as h
from agentreach.envelopes.events import AcceptedDetail, CompletedDetail, OutcomeDetail

CLOCKS_APART_MS = 5_000  # how far the agent's clock and the broker's may differ
LARGE = 300_000  # characters of a payload that a sender claim-checks (over 256 KiB)
CLAIM_CHECK_BYTES = 262_144  # above this, an agent should claim-check its result too


def first(items: list[Any]) -> Any:
    return items[0] if items else None


async def routed_here(s: Session, ex: Exchange) -> None:
    """A task sent through intake must reach this agent, or the clause judges nothing."""
    routed = await s.until(lambda: first(ex.events_of("routed")), 10.0, "routed event")
    if routed.agent_id != s.agent_id:
        raise Failed(
            f"the coordinator routed the task to {routed.agent_id!r}: run the kit where only"
            f" {s.agent_id!r} serves {s.topic!r} (or give another --topic)"
        )


async def outcome(
    s: Session, ex: Exchange, event: str, timeout_s: float, *, at_once: bool = True
) -> OutcomeDetail:
    """The agent's ``failed`` or ``expired`` event, its detail checked (a failure says what
    the agent did instead: see :meth:`Session.event_of`)."""
    found = await s.event_of(ex, event, timeout_s, at_once=at_once)
    if found.agent_id != s.agent_id:
        raise Failed(f"{event} event names agent_id {found.agent_id!r}")
    try:
        detail = decode_detail(found)
    except DecodeError as exc:
        raise Failed(str(exc)) from None
    assert isinstance(detail, OutcomeDetail)
    if detail.task.message_id != ex.task.message_id or detail.task.payload != ex.task.payload:
        raise Failed(f"{event} event's detail.task is not the task as received")
    return detail


async def ack_and_result(s: Session, c: Checks) -> str:
    """§10.6, §10.8, §11: sent by a caller with a reply box — ack within the budget,
    accepted, one result, completed, recorded; every reply on ``<box>.<agent_id>``."""
    value = new_id()
    ex = await s.submit(s.task({"op": "echo", "value": value}), as_caller=True)
    await routed_here(s, ex)
    ack = await s.until(lambda: first(ex.agent_replies()), 5.0, "reply")
    c.must(ack.body.__struct_config__.tag == "ack", f"first reply is {ack.body!r}, not an ack")
    ack_ms = (ack.at - ex.sent_at) * 1000
    c.must(ack_ms <= ex.task.budget.ack_ms, f"ack after {ack_ms:.0f} ms, budget 2000 ms")
    _about(c, ex, ack.body, "ack")
    c.must(ack.body.capacity is not None, "the ack carries capacity (free_slots, est_latency)")
    result = await s.until(lambda: first(ex.replies_of("result")), 10.0, "result reply")
    _about(c, ex, result, "result")
    c.must(result.result == {"value": value, "attempt": 1}, f"result is {result.result!r}")
    signed = f"{ex.task.reply_to}.{s.agent_id}"
    subjects = sorted({r.subject for r in ex.agent_replies()})
    c.must(subjects == [signed], f"replies to a box go to <box>.<agent_id>, not {subjects}")
    accepted = await s.until(lambda: first(ex.events_of("accepted")), 5.0, "accepted event")
    c.must(accepted.agent_id == s.agent_id, f"accepted names {accepted.agent_id!r}")
    _dispatched_at(c, ex, accepted)
    completed = await s.until(lambda: first(ex.events_of("completed")), 5.0, "completed event")
    c.must(completed.agent_id == s.agent_id, f"completed names {completed.agent_id!r}")
    for event in (accepted, completed):  # revision 35: one caller's id may be another's
        said = f"{event.event} names caller {event.caller!r}, not the task's {CALLER!r}"
        c.must(event.caller == CALLER, said)
    detail = decode_detail(completed)
    assert isinstance(detail, CompletedDetail)
    c.must(detail.result == result.result, "completed carries the result")
    record = await s.execution(ex.task, caller=CALLER)
    card = await s.card()
    c.must(record is not None and record.state == "done", f"execution record: {record}")
    assert record is not None
    c.must(record.result == result.result, "the execution record keeps the result")
    c.must((record.agent_id, record.epoch) == (s.agent_id, card.epoch), "record's agent/epoch")
    c.should(record.caller == CALLER, f"the record names the task's caller: {record.caller!r}")
    await s.quiet()
    c.must(len(ex.replies_of("result")) == 1, "exactly one result reply")
    c.must(not ex.replies_of("error"), "an agent never sends an error reply")
    for seen in ex.agent_replies():
        _reply_headers(c, ex, seen)
    return f"ack in {ack_ms:.0f} ms, result on <box>.<agent>, completed, recorded"


def _reply_headers(c: Checks, ex: Exchange, seen: Seen) -> None:
    """§11 (a MUST since revision 33): every reply carries ``Reach-Kind`` and
    ``Reach-Trace-Id``; one with no headers at all is a server's answer to a caller, who drops
    it (the Python client logs "reply without headers dropped")."""
    kind = seen.body.__struct_config__.tag
    c.must(
        bool(seen.headers),
        f"the {kind} reply carries no headers, not Reach-Kind and Reach-Trace-Id (§11,"
        " revision 33: a caller drops it for a server's answer)",
    )
    for name, wanted in ((h.KIND, kind), (h.TRACE_ID, ex.task.trace_id)):
        got = seen.headers.get(name)
        said = f"the {kind} reply's header {name} is {got!r}, not {wanted!r} (its headers: "
        c.must(got == wanted, f"{said}{seen.headers}; §11)")


def _dispatched_at(c: Checks, ex: Exchange, accepted: Event) -> None:
    """``accepted`` carries the broker's time of the dispatch (the message's timestamp) and
    the process's epoch."""
    detail = decode_detail(accepted)
    assert isinstance(detail, AcceptedDetail)
    at = detail.dispatched_at_ms
    c.should(at > 0, "accepted carries dispatched_at_ms, the broker time of the dispatch")
    c.should(detail.epoch > 0, "accepted carries epoch, the taking process's (its card's)")
    sent = ex.task.created_at
    c.should(
        sent - CLOCKS_APART_MS <= at <= now_ms() + CLOCKS_APART_MS,
        f"dispatched_at_ms {at} is not the time of the dispatch (sent at {sent})",
    )


def _about(c: Checks, ex: Exchange, reply: Any, kind: str) -> None:
    task = ex.task
    c.must(
        (reply.message_id, reply.trace_id, reply.topic, reply.attempt)
        == (task.message_id, task.trace_id, task.topic, task.attempt),
        f"the {kind} reply repeats the task's message_id, trace_id, topic and attempt",
    )
    c.should(reply.to_agent == task.from_agent, f"the {kind} reply's to_agent is the sender")


async def progress(s: Session, c: Checks) -> str:
    """§10.7, §12.1: each report a progress reply and a recorded event, none lost to dedup."""
    notes = ["one", "two", "three", "four"]
    ex = await s.dispatch(s.task({"op": "progress", "notes": notes}))
    await s.until(lambda: first(ex.replies_of("result")), 10.0, "result reply")
    kinds = [r.body.__struct_config__.tag for r in ex.agent_replies()]
    seen = [p.note for p in ex.replies_of("progress")]
    c.must(seen == notes, f"progress replies {seen}, not {notes}")
    c.must(kinds.index("result") > kinds.index("progress"), f"replies in order: {kinds}")
    await s.quiet()
    # Read as stored (the kit sent the task itself, so no `routed` vouches for the agent).
    stored = await read_stream(
        s.broker, s.names.events_stream, s.names.events_of_message(ex.task.message_id)
    )
    events = [decode_stored_event(m.data, m.headers) for m in stored]
    recorded = [e.detail.get("note") for e in events if e.event == "progress"]
    c.must(recorded == notes, f"progress events recorded {recorded}, not {notes}")
    return f"{len(notes)} progress replies and events, in order"


async def retryable_error(s: Session, c: Checks) -> str:
    """§10.8, §15.1: failed with the task and a retryable error; the retry completes."""
    message = f"failing once {new_id()}"
    ex = await s.submit(s.task({"op": "fail", "message": message, "until_attempt": 2}))
    await routed_here(s, ex)
    detail = await outcome(s, ex, "failed", 10.0)
    c.must(detail.error.retryable, "a handler's ordinary failure is retryable")
    c.must(detail.error.message == message, f"error.message is {detail.error.message!r}")
    c.should(detail.dispatched_at_ms > 0, "failed carries dispatched_at_ms")
    result = await s.until(lambda: first(ex.replies_of("result")), 20.0, "result of attempt 2")
    c.must(result.result == {"attempt": 2}, f"attempt 2 returned {result.result!r}")
    c.must(not ex.replies_of("error"), "no error reply for a task that completed")
    record = await s.execution(ex.task)
    c.must(record is not None and record.state == "done" and record.attempt == 2, f"{record}")
    return f"failed ({detail.error.type}), retried, attempt 2 completed"


async def permanent_error(s: Session, c: Checks) -> str:
    """§10.8: a permanent failure is not retryable; the coordinator dead-letters it."""
    message = f"refused {new_id()}"
    ex = await s.submit(s.task({"op": "reject", "message": message}))
    await routed_here(s, ex)
    detail = await outcome(s, ex, "failed", 10.0)
    c.must(not detail.error.retryable, "a permanent failure has retryable false")
    c.must(detail.error.message == message, f"error.message is {detail.error.message!r}")
    mid = ex.task.message_id
    await s.until(
        lambda: first([d for d in s.dead_letters if d.message_id == mid]), 10.0, "dead letter"
    )
    error = await s.until(lambda: first(ex.replies_of("error")), 5.0, "error reply")
    await s.quiet()
    c.must(len(ex.events_of("failed")) == 1, "run once, not retried")
    c.must(not ex.replies_of("result"), "no result")
    return f"failed ({error.error.type}, retryable false), dead-lettered as rejected"


async def deadline(s: Session, c: Checks) -> str:
    """§10.5: a handler past the execute budget fails as deadline_exceeded, retryable."""
    budget = Budget(execute_ms=500)
    # A late attempt: the coordinator dead-letters it instead of trying again. Four of the
    # attempts before it were moved unrun (revision 21): detail.task must say so too.
    late = s.task({"op": "sleep", "ms": 5_000}, budget=budget, attempt=9)
    ex = await s.dispatch(msgspec.structs.replace(late, requeued=4))
    started = await s.until(lambda: first(ex.replies_of("progress")), 5.0, "the handler start")
    begun = next(r.at for r in ex.replies if r.body is started)
    detail = await outcome(s, ex, "failed", 5.0)
    ended = next(e.at for e in ex.events if e.body.event == "failed")
    c.must(detail.error.type == "deadline_exceeded", f"error.type {detail.error.type!r}")
    c.must(detail.error.retryable, "deadline_exceeded is retryable")
    passed_on = detail.task.requeued
    c.should(passed_on == 4, f"detail.task.requeued {passed_on}, not the task's 4 (revision 21)")
    took = ended - begun
    c.must(0.4 <= took <= 2.5, f"failed {took:.2f} s after the start, budget 0.5 s")
    await s.quiet()
    c.must(not ex.replies_of("result"), "no result after the deadline")
    return f"deadline_exceeded {took:.2f} s into a 0.5 s budget"


async def unknown_topic(s: Session, c: Checks) -> str:
    """§10.3: a topic without a handler fails as no_handler, not retryable."""
    topic = f"{s.topic}_unknown_{new_id()[-12:]}"
    ex = await s.dispatch(s.task({"op": "echo"}, topic=topic))
    detail = await outcome(s, ex, "failed", 10.0)
    c.must(detail.error.type == "no_handler", f"error.type {detail.error.type!r}")
    c.must(not detail.error.retryable, "no_handler is not retryable")
    return "failed as no_handler"


async def invalid_envelope(s: Session, c: Checks) -> str:
    """§10.2: an undecodable dispatch is reported (its bytes, headers and the JSON path at
    fault), and the coordinator dead-letters it."""
    marker = new_id()
    text = (
        f'{{"v": 1, "kind": "task", "message_id": "{marker}", "trace_id": "{marker}",'
        f' "topic": "{s.topic}", "attempt": "one"}}'
    )
    await s.dispatch_raw(text.encode())
    letter = await s.until(
        lambda: first([d for d in s.dead_letters if d.raw == text]), 10.0, "dead letter"
    )
    c.must(letter.reason == "invalid_envelope", f"reason {letter.reason!r}")
    c.must(letter.topic == "_invalid", f"dead letter topic {letter.topic!r}")
    error = letter.error
    c.must(error is not None and error.type == "invalid_envelope", f"error {error}")
    assert error is not None
    c.must(not error.retryable, "invalid_envelope is not retryable")
    c.must("attempt" in error.message, f"the error names the field: {error.message!r}")
    c.should("$.attempt" in error.message, "the error names the JSON path $.attempt")
    c.must(letter.envelope is None and letter.message_id != marker, "no envelope; an id of its own")
    c.must(
        letter.headers.get("Reach-Reported-By") == s.agent_id,
        "the agent reports the dispatch (a failed event the coordinator dead-letters)",
    )
    c.should("Nats-Msg-Id" in letter.headers, "the report keeps the message's headers")
    await _nobody_s_dispatch(s, c)
    return f"dead-lettered: {error.message}"


async def _nobody_s_dispatch(s: Session, c: Checks) -> None:
    """§6 "Nobody's dispatch" (revision 24): a valid task the server copied into the queue
    (a direct get's answer, content anyone may choose) is not run but reported as no task."""
    forged = s.task({"op": "echo", "value": "forged"})
    exchange = await s.dispatch_by_server(forged)

    def reported() -> Event | None:
        # Its report, not the letter: a coordinator letters one such report a minute, for
        # every agent (a run right after another's would find none).
        return first([e for e in s.no_tasks if forged.message_id in str(e.detail.get("raw"))])

    await s.until(
        reported,
        10.0,
        "report, as no task, of the task the NATS server copied into the queue (§6, revision"
        " 24: a direct get's answer is nobody's dispatch)",
    )
    c.must(
        not exchange.events_of("accepted") and not exchange.agent_replies(),
        "a task the NATS server copied into the queue is not run (§6)",
    )


async def claim_check(s: Session, c: Checks) -> str:
    """§10.10: a task whose payload is claim-checked (``payload_ref``) runs on the stored
    payload; a large result should travel by reference; a reference to nothing fails as
    ``payload_unavailable``, not retryable, without running the handler. Skipped on a
    secured deployment (the kit has creds), whose permissions grant no Object Store access."""
    if s.broker.auth.identity is not None:
        raise Skipped(
            "a secured deployment has no claim check (its permissions grant no Object Store"
            " access): keep payloads under max_payload there"
        )
    value = "x" * LARGE
    t = s.task(None)
    ref = await s.stow(f"{t.message_id}/payload", {"op": "echo", "value": value})
    ex = await s.dispatch(msgspec.structs.replace(t, payload_ref=ref))
    ended = await s.until(
        lambda: first(ex.replies_of("result")) or first(ex.events_of("failed")), 15.0, "result"
    )
    if isinstance(ended, Event):
        raise Failed(f"the agent failed the task: {getattr(decode_detail(ended), 'error', None)}")
    result = ended
    returned = await s.fetch(result.result_ref) if result.result_ref else result.result
    c.must(returned == {"value": value, "attempt": 1}, "the handler did not get the stored payload")
    stowed = result.result_ref is not None
    c.should(stowed, f"a result over {CLAIM_CHECK_BYTES} B goes by reference")
    completed = await s.until(lambda: first(ex.events_of("completed")), 5.0, "completed event")
    detail = decode_detail(completed)
    assert isinstance(detail, CompletedDetail)
    c.must(
        (detail.result, detail.result_ref) == (result.result, result.result_ref),
        "completed carries what the result reply carried (result or result_ref)",
    )
    record = await s.execution(ex.task)
    c.must(record is not None and record.state == "done", f"execution record: {record}")
    assert record is not None
    c.must(record.result_ref == result.result_ref, "the execution record keeps the result_ref")
    # A reference to an object that is not (or no longer) stored.
    gone = msgspec.structs.replace(ref, name=f"{new_id()}/payload")
    lost = await s.dispatch(msgspec.structs.replace(s.task(None), payload_ref=gone))
    failed = await outcome(s, lost, "failed", 10.0)
    c.must(not failed.error.retryable, "a payload that cannot be had is not retryable")
    c.should(failed.error.type == "payload_unavailable", f"error.type {failed.error.type!r}")
    await s.quiet()
    c.must(not lost.replies_of("result"), "a result without the payload")
    how = "by reference" if result.result_ref else "inline"
    return f"payload read from the Object Store, result {how}; a lost one payload_unavailable"


async def event_format(s: Session, c: Checks) -> str:
    """§12: every event the agent published names it as the sender (subject and body), has
    its detail shape and its dedup id, and echoes the dispatch's grant."""
    checked = 0
    for ex in s.exchanges.values():
        # Intake stamps a submitted task's received_ms (the broker's time of storing it): the
        # agent echoes that one, which the coordinator's `routed` says.
        stamped = [e.body.received_ms for e in ex.events if e.body.event == "routed"]
        received_ms = stamped[0] if stamped else ex.task.received_ms
        for seen in ex.events:
            event: Event = seen.body
            if event.event not in AGENT_EVENTS:
                continue
            checked += 1
            where = f"{event.event} of {event.message_id}"
            try:
                detail = decode_detail(event)
            except DecodeError as exc:
                raise Failed(str(exc)) from None
            sender = s.names.sender_of(seen.subject)
            c.must(sender == s.agent_id, f"{where}: published as {sender!r} (the subject)")
            c.must(event.agent_id == s.agent_id, f"{where}: agent_id {event.agent_id!r}")
            got = seen.headers.get("Nats-Msg-Id")
            if event.event == "progress":
                c.should(got is None, f"{where}: no Nats-Msg-Id on a progress event")
            else:
                expected = f"{event.message_id}-{event.event}-{event.attempt}-{s.agent_id}"
                epoch = event.detail.get("epoch")
                if event.event == "accepted" and isinstance(epoch, int) and epoch > 0:
                    expected += f"-{epoch}"
                before_rev_19 = expected
                if event.received_ms > 0:  # one life of the message id (revision 19)
                    expected += f"-r{event.received_ms}"
                grant = event.detail.get("grant")
                if isinstance(grant, str):  # only the coordinator and the agent know it
                    expected += f"-{grant[:16]}"
                    before_rev_19 += f"-{grant[:16]}"
                said = f"{where}: sent Nats-Msg-Id {got!r}; expected {expected!r}"
                c.must(got in (expected, before_rev_19), said)
                c.should(
                    got == expected, f"{said}: without the life's -r<received_ms> (revision 19)"
                )
            if ex.grant is not None and event.event != "clock_drift":
                grant = getattr(detail, "grant", None)
                c.must(grant == ex.grant, f"{where}: the dispatch's grant not echoed ({grant!r})")
            c.should(event.at_ms > 0, f"{where}: at_ms")
            if event.event != "clock_drift":
                task = ex.task
                c.should(event.priority == task.priority, f"{where}: priority {event.priority}")
                c.should(
                    event.received_ms == received_ms,
                    f"{where}: received_ms {event.received_ms}, not the task's {received_ms}",
                )
    c.must(checked > 0, "no agent event seen")
    return f"{checked} agent events: sender, detail shapes, Nats-Msg-Id, grants as specified"
