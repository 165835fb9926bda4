"""The failures of a run that are not its handler raising: its budget spent before it could
start, a result its execution record cannot hold, a failure of the run's own."""

from __future__ import annotations

from agentreach import envelopes
from agentreach.agents.claims import Claimed, Outcome
from agentreach.broker import TooLarge, ValueTooLarge
from agentreach.envelopes import ErrorInfo, Task
from agentreach.logs import get_logger

log = get_logger("agents")


def spent(task: Task, claim: Claimed) -> ErrorInfo:
    """Why a run taken over from a crashed one does not start: the budget is gone."""
    message = (
        f"execute budget {task.budget.execute_ms} ms of attempt {task.attempt} spent: a run"
        f" of it began at {claim.started_ms} (epoch ms) and did not finish"
    )
    return ErrorInfo(type="deadline_exceeded", message=message, retryable=True)


def failed(claim: Claimed, error: ErrorInfo | None) -> Outcome:
    """A failure that is not the handler raising (that one is logged with its traceback)."""
    assert error is not None
    log.info("handler failed", error_type=error.type, error=error.message)
    return Outcome(claim, error=error)


def unrecordable(outcome: Outcome, exc: ValueTooLarge | TooLarge) -> Outcome:
    """The failure to record instead of ``outcome``, whose result its execution record
    cannot hold: ``result_too_large``, not retryable (every run would end so), saying what
    to do. Only a result makes a record that large; a failure's error is small."""
    size = len(envelopes.encode(outcome.result))
    message = (
        f"the result ({size} bytes of JSON) does not fit its execution record ({exc}): return"
        " less, or let it travel by claim check (an agent's claim_check_bytes below the"
        " coordinator's limits.record_bytes, on an open server)"
    )
    error = ErrorInfo(type="result_too_large", message=message, retryable=False)
    return Outcome(outcome.claim, error=error)
