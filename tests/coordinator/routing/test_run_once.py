"""Which reports of a message's runs still count, from its execution records (pure)."""

from __future__ import annotations

from agentreach.coordinator.routing.run_once import REASSIGNED, superseded
from agentreach.envelopes import ErrorInfo, Execution


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
    assert superseded([record("a", 1, "failed", at_ms=1_000)], "a", 1, 1_001) is None


def test_a_report_of_an_attempt_taken_from_its_agent_does_not() -> None:
    fenced = record("a", 1, "failed", error=REASSIGNED)
    assert superseded([fenced], "a", 1, 5_000) == "the attempt was taken from its agent"


def test_a_report_of_an_attempt_after_which_another_was_dispatched_does_not() -> None:
    """The fence of attempt 1 overwritten by the same agent's claim of attempt 2."""
    why = superseded([record("a", 2, "running")], "a", 1, 5_000)
    assert why == "attempt 2 was dispatched since"


def test_a_report_older_than_a_later_failure_of_the_same_attempt_does_not() -> None:
    """A stalled run's report, after its redelivery ran the attempt and failed too."""
    later = record("a", 1, "failed", at_ms=9_000)
    why = superseded([later], "a", 1, 5_000)
    assert why == "a later run of the attempt failed since, and reports for itself"
    assert superseded([later], "b", 1, 5_000) is None  # another agent's record: not its run
