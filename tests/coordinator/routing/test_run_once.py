"""Which reports of a message's runs still count, from its execution records (pure)."""

from __future__ import annotations

import msgspec

from agentreach.coordinator.routing.run_once import (
    LEASE_PAST_TTL_MS,
    REASSIGNED,
    Running,
    lease_limit,
    superseded,
    verdict_of,
)
from agentreach.envelopes import Budget, ErrorInfo, Execution, Task, now_ms


def record(
    agent: str, attempt: int, state: str, *, at_ms: int = 1_000, error: str = ""
) -> Execution:
    return Execution(
        message_id="m-1",
        state=state,  # type: ignore[arg-type]
        agent_id=agent,
        attempt=attempt,
        finished_at_ms=at_ms if state != "running" else 0,
        error=ErrorInfo(type=error, message=error) if error else None,
    )


def test_a_report_of_its_own_failure_counts() -> None:
    """The agent recorded the failure, then reported it (a record comes before its report)."""
    assert superseded([record("a", 1, "failed", at_ms=1_000)], "a", 1, 1_001, 1_002) is None


def test_a_report_of_an_attempt_taken_from_its_agent_does_not() -> None:
    fenced = record("a", 1, "failed", error=REASSIGNED)
    assert superseded([fenced], "a", 1, 5_000, 5_001) == "the attempt was taken from its agent"


def test_a_failure_of_an_attempt_the_coordinator_ended_as_expired_does_not() -> None:
    """Its expiry fence stands (the attempt was not reported in time): a failure reported
    later must not retry it. The agent's own expiry report is the fence's business."""
    fenced = record("a", 1, "failed", error="expired")
    why = superseded([fenced], "a", 1, 5_000, 5_001, 0, "failed")
    assert why == "the coordinator ended the attempt as expired: it was not reported in time"
    assert superseded([fenced], "a", 1, 5_000, 5_001, 0, "expired") is None


def test_a_report_of_an_attempt_after_which_another_was_dispatched_does_not() -> None:
    """The fence of attempt 1 overwritten by the same agent's claim of attempt 2."""
    why = superseded([record("a", 2, "running")], "a", 1, 5_000, 5_001)
    assert why == "attempt 2 was dispatched since"


def test_a_report_older_than_a_later_failure_of_the_same_attempt_does_not() -> None:
    """A stalled run's report, after its redelivery ran the attempt and failed too, past
    the events stream's duplicate window (the later run's report is stored: it decides)."""
    later = record("a", 1, "failed", at_ms=200_000)
    why = superseded([later], "a", 1, 5_000, 5_001)
    assert why == "a later run of the attempt failed since, and reports for itself"
    assert superseded([later], "b", 1, 5_000, 5_001) is None  # another agent's: not its run


def test_a_report_stands_for_a_later_failure_whose_report_the_stream_drops() -> None:
    """The later run failed within the duplicate window of this report's storage: its own
    report has this one's Nats-Msg-Id and is dropped, so this one counts (the task was
    left alone, waiting for a report that never came, and never retried)."""
    later = record("a", 1, "failed", at_ms=9_000)
    assert superseded([later], "a", 1, 5_000, 5_001) is None
    assert superseded([later], "a", 1, 5_000, 5_001 - 110_000) is not None


def test_a_lease_counts_no_later_than_the_task_s_ttl_budget_and_a_margin() -> None:
    """A run under a day's lease of a task with a 30 s ttl and a 20 s execute budget is
    waited for until a run begun at the ttl's end could have run its budget, and a margin,
    not a day: a lease holds the message, and its place in intake."""
    now = now_ms()
    task = Task(
        v=1,
        message_id="m-1",
        trace_id="m-1",
        topic="t",
        ttl_ms=30_000,
        received_ms=now,
        budget=Budget(execute_ms=20_000),
    )
    held = msgspec.structs.replace(record("a", 1, "running"), lease_until_ms=now + 86_400_000)
    limit = lease_limit(task)
    assert limit == now + 30_000 + 20_000 + LEASE_PAST_TTL_MS
    running = verdict_of([held], until_ms=limit)
    assert isinstance(running, Running)
    assert running.left_s <= (50_000 + LEASE_PAST_TTL_MS) / 1000
    assert verdict_of([held], until_ms=now - 1) is None  # its ttl and the margin have passed


def test_a_dispatch_s_ttl_counts_from_the_dispatch() -> None:
    """A retry routed 100 s after the task was taken in carries the 1 s of ttl left then:
    its lease counts from the dispatch's ttl end, not from `received_ms` + 1 s (long past)."""
    now = now_ms()
    retry = Task(
        v=1, message_id="m-2", trace_id="m-2", topic="t", ttl_ms=1_000, received_ms=now - 100_000
    )
    limit = lease_limit(retry, ttl_end_ms=now + 1_000)
    assert limit == now + 1_000 + retry.budget.execute_ms + LEASE_PAST_TTL_MS


def test_records_of_an_earlier_life_of_the_message_id_do_not_supersede() -> None:
    """Sent again past the duplicate window after it ended (retries exhausted at attempt 3
    on agent b): this life's attempt 1 failing on agent a is a report that counts; a record
    of this life's attempt 2 still supersedes it."""
    received = 100_000
    earlier = [record("b", 3, "failed", at_ms=received - 5_000)]
    assert superseded(earlier, "a", 1, received + 2_000, received + 2_001, received) is None
    assert superseded(earlier, "a", 1, received + 2_000, received + 2_001) is not None  # unknown
    later = [*earlier, record("b", 2, "running")]
    why = superseded(later, "a", 1, received + 2_000, received + 2_001, received)
    assert why == "attempt 2 was dispatched since"


def test_a_lease_passed_counts_until_the_grace_after_an_outage_ends() -> None:
    """No lease could be renewed while the server was away: one that passed counts as
    running until the grace after the connection came back, still no later than the ttl's
    limit; a finished run is finished whatever the grace."""
    now = now_ms()
    lapsed = msgspec.structs.replace(record("a", 1, "running"), lease_until_ms=now - 5_000)
    assert verdict_of([lapsed]) is None
    running = verdict_of([lapsed], grace_until_ms=now + 4_000)
    assert isinstance(running, Running) and 3.0 < running.left_s <= 4.0
    assert verdict_of([lapsed], until_ms=now - 1, grace_until_ms=now + 4_000) is None
    done = record("a", 1, "done")
    assert verdict_of([done], grace_until_ms=now + 4_000) is not None
