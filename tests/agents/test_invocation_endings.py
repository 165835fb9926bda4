"""Rejected or TaskFailed: what a caller concludes from an ending that says whether its
work began (a workflow's), over the acks and events it saw (pure: no server)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from agentreach.agents import DeadlineExceeded, Rejected, TaskFailed
from agentreach.agents.invocation import Ending, outcome_of, wait_for_result
from agentreach.broker import BrokerTimeout
from agentreach.broker.endings import Ended, ending_of
from agentreach.envelopes import Ack, Budget, ErrorInfo, ErrorReply, Event, Task

EXPIRED = ErrorInfo(type="expired", message="the ttl passed", retryable=False)
IDS = {"message_id": "wf-1", "trace_id": "wf-1"}
TASK = Task(v=1, message_id="wf-1", trace_id="wf-1", topic="brief")


class _Broker:
    reconnects = 0


async def _nothing() -> list[Event]:
    return []


async def _ending_of(*replies: Ack | ErrorReply) -> Exception:
    queue: asyncio.Queue = asyncio.Queue()
    for message in replies:
        queue.put_nowait(message)
    ending = Ending(_Broker(), _nothing)  # type: ignore[arg-type]
    with pytest.raises(TaskFailed) as raised:
        await wait_for_result(TASK, queue, None, None, ending)
    return raised.value


async def test_a_workflow_that_dispatched_a_step_is_never_rejected() -> None:
    """Its expiry says ran: TaskFailed with no ack seen (a lost one), Rejected when it says
    nothing ran though its instance was acknowledged (created)."""
    about = {"v": 1, "message_id": "wf-1", "trace_id": "wf-1", "topic": "brief"}
    ran = ErrorReply(**about, error=EXPIRED, reason="expired", ran=True)
    assert type(await _ending_of(ran)) is TaskFailed
    nothing = ErrorReply(**about, error=EXPIRED, reason="expired", ran=False)
    assert type(await _ending_of(Ack(**about), nothing)) is Rejected


def test_an_ending_read_from_events_keeps_what_it_says_of_ran() -> None:
    """A resend reads the `dead_lettered` event: its `ran` decides over the accepted events
    (a workflow has none of its own); without one, they decide as before."""
    detail = {"reason": "expired", "error": {"type": "expired", "message": "ttl"}, "ran": True}
    event = Event(v=1, message_id="wf-1", trace_id="wf-1", topic="brief", event="dead_lettered")
    ended = ending_of([msgspec.structs.replace(event, detail=detail)])
    assert ended is not None and ended.ran is True
    with pytest.raises(TaskFailed) as raised:
        outcome_of(ended, IDS, ran=False)
    assert type(raised.value) is TaskFailed
    with pytest.raises(Rejected):
        outcome_of(Ended(error=EXPIRED, reason="expired"), IDS, ran=False)


async def test_a_failure_names_the_attempt_its_ending_came_at() -> None:
    """TaskFailed.attempt is the error reply's attempt, or the ending event's when the end
    was read from the trace (a reply lost)."""
    about = {"v": 1, "message_id": "wf-1", "trace_id": "wf-1", "topic": "brief", "attempt": 3}
    error = {"type": "KeyError", "message": "x"}
    detail = {"reason": "retries_exhausted", "error": error, "attempts": 2}  # one moved unrun
    event = Event(**about, event="dead_lettered", detail=detail)
    with pytest.raises(TaskFailed) as raised:
        outcome_of(ending_of([event]) or Ended(), IDS, ran=True)
    assert raised.value.attempt == 3 and raised.value.ending == "retries_exhausted"
    assert raised.value.attempts == 2
    replied = ErrorReply(**about, error=EXPIRED, reason="expired", ran=True, attempts=2)
    assert getattr(await _ending_of(replied), "attempt", None) == 3
    assert getattr(await _ending_of(replied), "attempts", None) == 2


SLOW = Task(
    v=1,
    message_id="slow-1",
    trace_id="slow-1",
    topic="slow",
    ttl_ms=120_000,
    budget=Budget(ack_ms=30_000, execute_ms=60_000),
)


class _Reconnecting:
    reconnects = 0


@pytest.mark.parametrize("acked", [True, False], ids=["acked", "ack-lost-too"])
async def test_a_reconnect_mid_wait_reads_the_end_within_seconds_not_at_the_deadline(
    acked: bool,
) -> None:
    """The result reply was lost while the connection was down: a reconnect during the wait
    starts the reads of the events within a second, and their `completed` is the answer
    (it came only at the ttl, 120 s, or at the ack deadline, 30 s)."""
    broker = _Reconnecting()
    about = {"v": 1, "message_id": "slow-1", "trace_id": "slow-1", "topic": "slow"}
    completed = Event(**about, event="completed", detail={"result": {"n": 8}})
    accepted = Event(**about, event="accepted")

    async def events() -> list[Event]:
        return [accepted, completed] if broker.reconnects else []

    queue: asyncio.Queue = asyncio.Queue()
    if acked:
        queue.put_nowait(Ack(**about))
    ending = Ending(broker, events)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, setattr, broker, "reconnects", 1)  # the server came back
    started = loop.time()
    async with asyncio.timeout(10):
        result = await wait_for_result(SLOW, queue, None, None, ending)
    assert result == ({"n": 8}, None)
    assert loop.time() - started < 2.5


async def test_reads_of_the_events_with_the_server_away_end_the_wait_near_its_deadline() -> None:
    """With the server away each read of the events waited 5 s: a wait whose deadline was
    9 s ended at 15 s, saying it may still complete (a TypeScript caller's trial; Python's
    too). Reads are given what is left of the wait (at least 1 s), and the error says they
    failed."""
    broker = _Reconnecting()
    broker.reconnects = 1  # the connection broke: the events are read every second
    task = Task(
        v=1,
        message_id="away-1",
        trace_id="away-1",
        topic="slow",
        ttl_ms=1_000,
        budget=Budget(ack_ms=500, execute_ms=800),
    )
    queue: asyncio.Queue = asyncio.Queue()
    queue.put_nowait(Ack(v=1, message_id="away-1", trace_id="away-1", topic="slow"))

    async def server_away() -> list[Event]:
        await asyncio.sleep(5)  # the request's own timeout: what an unanswered read takes
        raise BrokerTimeout("timed out on 'reach.ctl.trace.c'")

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(DeadlineExceeded) as raised:
        await wait_for_result(task, queue, None, None, Ending(broker, server_away))  # type: ignore[arg-type]
    took_s = loop.time() - started
    assert took_s < 4.5, took_s  # the deadline (1 s), the verdict's grace (1 s), a last read
    assert "its events could not be read" in str(raised.value)


async def test_a_retry_accepted_late_in_the_ttl_is_waited_for_its_whole_budget() -> None:
    """Each ack starts its attempt's execute budget: a retry accepted just before the ttl
    ends runs its budget past it, and the coordinator's verdict comes after that. The wait
    counted only from the first ack and gave up (DeadlineExceeded) before hearing it."""
    task = Task(
        v=1,
        message_id="late-1",
        trace_id="late-1",
        topic="slow",
        ttl_ms=1_300,
        budget=Budget(ack_ms=1_000, execute_ms=1_200),
    )
    about = {"v": 1, "message_id": "late-1", "trace_id": "late-1", "topic": "slow"}
    queue: asyncio.Queue = asyncio.Queue()
    queue.put_nowait(Ack(**about))
    loop = asyncio.get_running_loop()
    retried = {**about, "attempt": 2}
    loop.call_later(1.2, queue.put_nowait, Ack(**retried))  # the retry, before the ttl ends
    verdict = ErrorReply(**retried, error=EXPIRED, reason="expired", ran=True)
    loop.call_later(2.45, queue.put_nowait, verdict)  # its budget ran out: no attempt 3
    async with asyncio.timeout(10):
        with pytest.raises(TaskFailed) as raised:
            await wait_for_result(task, queue, None, None, Ending(_Broker(), _nothing))  # type: ignore[arg-type]
    assert raised.value.ending == "expired" and raised.value.attempt == 2


def test_a_failure_names_its_message_and_how_it_ended() -> None:
    """`str(TaskFailed)` was only "expired: the ttl passed": a log line with no id to look
    the task up by."""
    failed = TaskFailed(EXPIRED, **IDS, ending="retries_exhausted", attempt=3)
    assert str(failed) == "expired: the ttl passed (message wf-1, retries_exhausted)"
    assert str(Rejected(EXPIRED, **IDS)) == "expired: the ttl passed (message wf-1)"
