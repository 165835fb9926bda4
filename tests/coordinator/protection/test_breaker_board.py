"""Which outcomes a breaker counts: what says something about the agent to every caller,
not what one sender's own limits caused (pure logic; tests/e2e/test_protection.py runs it
through a server)."""

from __future__ import annotations

from typing import Any

import pytest

from agentreach.coordinator import BreakerConfig
from agentreach.coordinator.protection.breaker_board import BreakerBoard
from agentreach.envelopes import Event


def outcome(kind: str, error: dict[str, Any] | None = None, execute_ms: int = 1500) -> Event:
    task = {"topic": "slow", "budget": {"execute_ms": execute_ms}}
    detail = {"task": task, "error": error} if error else {}
    return Event(
        v=1, message_id="m", trace_id="t", topic="slow", event=kind, agent_id="z", detail=detail
    )


def deadline(retryable: bool = True) -> dict[str, Any]:
    return {
        "type": "deadline_exceeded",
        "message": "handler ran past 1500 ms",
        "retryable": retryable,
    }


def board(declared: int | None) -> BreakerBoard:
    return BreakerBoard(None, BreakerConfig(), declared_deadline=lambda agent, intent: declared)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("event", "declared", "counts"),
    [
        (outcome("completed"), None, True),
        (outcome("failed", {"type": "RuntimeError", "message": "disk full"}), None, True),
        (
            outcome("failed", {"type": "rejected", "message": "bad", "retryable": False}),
            None,
            False,
        ),
        (outcome("expired", {"type": "expired", "message": "ttl 5 ms passed"}), None, False),
        # cut by the sender's budget: the intent declares no deadline, or a longer one
        (outcome("failed", deadline()), None, False),
        (outcome("failed", deadline()), 5000, False),
        (outcome("failed", deadline()), 1500, False),
        # cut by the deadline the intent declares itself
        (outcome("failed", deadline()), 200, True),
        # moved to another agent unrun while this one did not answer: liveness's business
        (
            outcome("failed", {"type": "reassigned", "message": "moved", "retryable": True}),
            None,
            False,
        ),
    ],
)
def test_a_breaker_counts_what_says_something_about_the_agent(
    event: Event, declared: int | None, counts: bool
) -> None:
    assert board(declared)._counts(event) is counts


def failure(message_id: str, kind: str = "RuntimeError") -> Event:
    error = {"type": kind, "message": "down", "retryable": True}
    return Event(
        v=1,
        message_id=message_id,
        trace_id=message_id,
        topic="flaky",
        event="failed",
        agent_id="z",
        detail={"error": error},
    )


async def test_outcomes_stored_before_the_replica_started_fill_its_windows_unjudged(broker):
    """A replica started just after a burst of failures read them again (the last window's
    worth) and judged a window it had only part of: it opened a healthy agent's breaker
    (twice in an outside walkthrough, 20 tasks refused each time). Read again, they fill
    the windows; the next live failure is judged on the whole window."""
    config = BreakerConfig(min_calls=4, error_ratio=0.4, isolation_failures=3)
    now = [100_000]
    started = BreakerBoard(broker, config, clock=lambda: now[0])
    for n in range(5):  # stored before the replica started
        await started.record_outcome(failure(f"old-{n}"), at_ms=99_000 + n)
    assert started.records == {} and started.isolated == []
    now[0] = 100_500
    await started.record_outcome(failure("live-1"), at_ms=100_400)
    assert started.records["z.flaky"].state == "open"  # the whole window, judged live
    assert started.isolated == ["z"]  # six failures in a row, the last one live


async def test_the_retries_of_one_message_are_one_failure_in_a_row(broker):
    """One poison message retried six times isolated its agent, and every other topic of it
    was refused (a Celery user's walkthrough): its attempts count once; three different
    messages failing in a row still isolate it."""
    config = BreakerConfig(min_calls=1000, isolation_failures=3)
    now = [100_000]
    board = BreakerBoard(broker, config, clock=lambda: now[0])
    for _ in range(6):
        now[0] += 1000
        await board.record_outcome(failure("poison-1"), at_ms=now[0])
    assert board.isolated == []
    for message_id in ("other-1", "other-2"):
        now[0] += 1000
        await board.record_outcome(failure(message_id), at_ms=now[0])
    assert board.isolated == ["z"]
    assert board.records["z"].reason == "3 messages failed in a row"


async def test_attempts_moved_away_unrun_do_not_isolate_their_agent(broker):
    """A 20 s SIGSTOP of the only agent (a trial): its waiting tasks were moved, and once back
    it reported each one `failed`, `reassigned`, unrun. Those isolated it, and every task
    after was dead-lettered as refused. They are not counted; its own failures still are."""
    config = BreakerConfig(min_calls=1000, isolation_failures=3)
    now = [100_000]
    board = BreakerBoard(broker, config, clock=lambda: now[0])
    for n in range(6):
        now[0] += 1000
        await board.record_outcome(failure(f"moved-{n}", kind="reassigned"), at_ms=now[0])
    assert board.isolated == [] and board.records == {}
    for n in range(3):
        now[0] += 1000
        await board.record_outcome(failure(f"own-{n}"), at_ms=now[0])
    assert board.isolated == ["z"]
