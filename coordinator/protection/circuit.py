"""One circuit breaker's record and its transitions (pure; no I/O).

closed ──(≥ error_ratio of ≥ min_calls in the window)──▶ open
open ──(open_s passed; the router sends a trial)──▶ half_open
half_open ──(trial_calls trials succeed)──▶ closed (the window starts afresh)
half_open ──(a trial fails, or trials do not report by their deadline)──▶ open

A breaker is kept per (agent, intent); the same record with ``intent=""``
isolates a whole agent after consecutive failures, lifted by one good trial.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from agentreach.coordinator.units import Positive, PositiveSeconds, Ratio
from agentreach.envelopes import BreakerRecord


class BreakerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Circuit breakers per (agent, intent), and isolation of an agent that keeps failing."""

    window_s: PositiveSeconds = 300.0
    error_ratio: Ratio = 0.4
    min_calls: Positive = 10
    open_s: PositiveSeconds = 10.0
    trial_calls: Positive = 3
    trial_timeout_s: PositiveSeconds = 30.0  # trials that never report count as failures
    isolation_failures: Positive = 5  # messages failing in a row at one agent, across intents


@dataclass(frozen=True, slots=True)
class Admission:
    """May this breaker take a call now: ``ok``, only as a ``trial``, or ``blocked`` (why)."""

    verdict: Literal["ok", "trial", "blocked"]
    why: str = ""


OK = Admission("ok")


def admission(record: BreakerRecord | None, now_ms: int, trial_calls: int) -> Admission:
    if record is None or record.state == "closed":
        return OK
    what = f"circuit of {record.intent}" if record.intent else "agent isolated"
    if record.state == "open":
        if now_ms < record.open_until_ms:
            return Admission("blocked", f"{what} open ({record.reason})")
        return Admission("trial")
    if record.trials and now_ms >= record.trial_deadline_ms:
        return Admission("blocked", f"{what} half-open, trials overdue")
    if len(record.trials) < trial_calls:
        return Admission("trial")
    return Admission("blocked", f"{what} half-open, trials in flight")


def opened(record: BreakerRecord, now_ms: int, reason: str, config: BreakerConfig) -> BreakerRecord:
    return msgspec.structs.replace(
        record,
        state="open",
        since_ms=now_ms,
        reason=reason,
        open_until_ms=now_ms + int(config.open_s * 1000),
        trials=[],
        trial_ok=0,
        trial_deadline_ms=0,
    )


def lifted(record: BreakerRecord, now_ms: int, reason: str) -> BreakerRecord | None:
    """Closed for ``reason`` (its agent is gone: no trial would ever come); None when it is
    closed already."""
    if record.state == "closed":
        return None
    return BreakerRecord(
        agent_id=record.agent_id,
        intent=record.intent,
        state="closed",
        since_ms=now_ms,
        reason=reason,
        counted_from_ms=now_ms,
    )


def with_trial(
    record: BreakerRecord, message_id: str, now_ms: int, config: BreakerConfig
) -> BreakerRecord:
    """``record`` half-open with one more trial call, ``message_id``."""
    entering = record.state != "half_open"
    return msgspec.structs.replace(
        record,
        state="half_open",
        since_ms=now_ms if entering else record.since_ms,
        trials=[*record.trials, message_id],
        trial_ok=0 if entering else record.trial_ok,
        trial_deadline_ms=now_ms + int(config.trial_timeout_s * 1000),
    )


def after_trial(
    record: BreakerRecord,
    message_id: str,
    *,
    ok: bool,
    now_ms: int,
    needed: int,
    config: BreakerConfig,
) -> BreakerRecord | None:
    """The record once trial ``message_id`` reported; None when it is not a pending trial."""
    if record.state != "half_open" or message_id not in record.trials:
        return None
    if not ok:
        return opened(record, now_ms, "a trial call failed", config)
    trial_ok = record.trial_ok + 1
    if trial_ok >= needed:
        return BreakerRecord(
            agent_id=record.agent_id,
            intent=record.intent,
            state="closed",
            since_ms=now_ms,
            reason=f"{trial_ok} trial calls succeeded",
            counted_from_ms=now_ms,
        )
    trials = [t for t in record.trials if t != message_id]
    return msgspec.structs.replace(record, trials=trials, trial_ok=trial_ok)


def overdue(record: BreakerRecord, now_ms: int, config: BreakerConfig) -> BreakerRecord | None:
    """Open again a half-open breaker whose trials never reported; None when not overdue."""
    if record.state == "half_open" and record.trials and now_ms >= record.trial_deadline_ms:
        return opened(record, now_ms, "trial calls did not report in time", config)
    return None


@dataclass(slots=True)
class Window:
    """Calls and errors per second over a sliding time window."""

    span_s: float
    seconds: deque[list[int]] = field(default_factory=deque)  # [second, calls, errors]

    def add(self, at_ms: int, ok: bool) -> None:
        second = at_ms // 1000
        if self.seconds and self.seconds[-1][0] == second:
            slot = self.seconds[-1]
        else:
            slot = [second, 0, 0]
            self.seconds.append(slot)
        slot[1] += 1
        slot[2] += 0 if ok else 1

    def counts(self, now_ms: int, since_ms: int = 0) -> tuple[int, int]:
        """(calls, errors) in the window ending at ``now_ms``, not before ``since_ms``."""
        # The second holding ``since_ms`` is left out whole: a reset forgets, never remembers.
        horizon = max((now_ms - int(self.span_s * 1000)) // 1000, -(-since_ms // 1000))
        while self.seconds and self.seconds[0][0] < now_ms // 1000 - self.span_s:
            self.seconds.popleft()
        calls = errors = 0
        for second, c, e in self.seconds:
            if second >= horizon:
                calls += c
                errors += e
        return calls, errors


def trip_reason(calls: int, errors: int, config: BreakerConfig) -> str | None:
    """Why a closed breaker with these counts opens, or None."""
    if calls < config.min_calls or errors / calls < config.error_ratio:
        return None
    return f"{errors} of {calls} calls failed in {config.window_s:g} s"
