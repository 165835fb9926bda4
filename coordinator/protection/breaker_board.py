"""Every circuit breaker, shared by all coordinator replicas through ``reach_breakers``.

Each replica is handed every outcome event agents report (``coordinator.feed``)
from ``window_s`` ago, so each holds the same sliding windows and
consecutive-failure counts without writing per call. Only transitions are
written, as conditional KV updates: when two replicas see the same reason to
open a breaker, one write wins and the other finds it open already. Trials are
named by message id in the record, so their outcome is counted once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import structlog

from agentreach.broker import Broker, BrokerError, Bucket, BucketWatch, Change, Entry
from agentreach.broker.errors import honour_cancellation, pause
from agentreach.broker.lifecycle import agent_event, emit
from agentreach.coordinator.protection.circuit import (
    OK,
    Admission,
    BreakerConfig,
    Window,
    admission,
    after_trial,
    lifted,
    opened,
    overdue,
    trip_reason,
    with_trial,
)
from agentreach.envelopes import (
    REASSIGNED,
    SUB_TASK_FAILED,
    BreakerRecord,
    Budget,
    DecodeError,
    Event,
    breaker_key,
    decode_as,
    now_ms,
)
from agentreach.envelopes.coordination import WHOLE_AGENT

log = structlog.get_logger("coordinator.breakers")

SWEEP_S = 1.0
DEADLINE_EXCEEDED = "deadline_exceeded"
Transition = Callable[[BreakerRecord | None], BreakerRecord | None]
# The deadline_ms an agent's card declares for an intent (None: none declared, or no card).
DeclaredDeadline = Callable[[str, str], int | None]
# Why an agent is gone (stopped, OFFLINE), or None while it runs.
Gone = Callable[[str], str | None]
Registered = Callable[[str], bool]  # whether the agent has a card (is not forgotten)


class BreakerBoard:
    """Breakers per (agent, intent) and isolation per agent, as the router asks about them."""

    def __init__(
        self,
        broker: Broker,
        config: BreakerConfig,
        clock: Callable[[], int] = now_ms,
        *,
        declared_deadline: DeclaredDeadline = lambda agent_id, intent: None,
        gone: Gone = lambda agent_id: None,
        registered: Registered = lambda agent_id: True,
    ) -> None:
        self._broker = broker
        self._config = config
        self._clock = clock
        # Outcomes stored before this replica started are read again to fill its windows,
        # not judged: a window being filled holds only part of what happened (a replica
        # started after a burst of failures opened a healthy agent's breaker), and what
        # they said was the live replicas' to act on.
        self._live_from_ms = clock()
        self._declared_deadline = declared_deadline
        self._gone = gone
        self._registered = registered
        self.records: dict[str, BreakerRecord] = {}
        self._tripped: dict[str, set[str]] = {}  # agent → keys of its breakers not closed
        self._revisions: dict[str, int] = {}
        self._windows: dict[str, Window] = {}
        # agent → the messages that failed there in a row (retries of one are one failure)
        self._failures_in_a_row: dict[str, list[str]] = {}

    def _counts(self, event: Event) -> bool:
        """Outcomes that say something about the agent to every caller. Not those its
        sender causes: a task refused as invalid, a ttl that ran out before the handler
        started (``expired``; a backlog is the watermarks' business), a handler cut short
        by the sender's own execute budget — unless the intent declares a shorter
        ``deadline_ms`` — or one failed by a task it sent (``sub_task_failed``). One caller's
        tight limits, or one busy dependency, must not close an agent to everyone. Nor an
        attempt moved away from it unrun (``reassigned``): liveness judged that already."""
        if event.event == "expired" or _refused_as_invalid(event) or _dependency_failed(event):
            return False
        if _moved_away(event):
            return False
        budget_ms = _cut_short_ms(event)
        if budget_ms is None:
            return True
        declared = self._declared_deadline(event.agent_id or "", event.topic)
        return declared is not None and declared < budget_ms

    # -- what the router asks ---------------------------------------------------------
    def admission(self, agent_id: str, intent: str) -> tuple[Admission, str]:
        """May ``agent_id`` take a call for ``intent`` now; and the key of the deciding record."""
        if agent_id not in self._tripped:
            return OK, ""
        now = self._clock()
        for key in (agent_id, breaker_key(agent_id, intent)):
            verdict = admission(self.records.get(key), now, self._trials(key))
            if verdict is not OK:
                return verdict, key
        return OK, ""

    def tripped_agents(self) -> Collection[str]:
        """Agents with a breaker or an isolation that is not closed."""
        return self._tripped.keys()

    def _trials(self, key: str) -> int:
        """Trial calls a half-open record takes: one to lift an isolation, else trial_calls."""
        return self._config.trial_calls if "." in key else 1

    @property
    def isolated(self) -> list[str]:
        return sorted(agent for agent, keys in self._tripped.items() if agent in keys)

    async def begin_trial(self, key: str, message_id: str) -> bool:
        """Record ``message_id`` as a trial call of ``key``; False when no trial is free."""

        def trial(record: BreakerRecord | None) -> BreakerRecord | None:
            if (
                record is None
                or admission(record, self._clock(), self._trials(key)).verdict != "trial"
            ):
                return None
            return with_trial(record, message_id, self._clock(), self._config)

        return await self._transition(key, trial) is not None

    # -- keeping current --------------------------------------------------------------
    async def run(self, ready: asyncio.Event) -> None:
        """Follow the bucket until cancelled; outcomes arrive through :meth:`record_outcome`."""
        async with (await self._bucket()).watch() as watch, asyncio.TaskGroup() as group:
            group.create_task(self._follow_records(watch))
            await watch.initial.wait()
            group.create_task(self._sweep_forever())
            ready.set()

    async def _follow_records(self, watch: BucketWatch) -> None:
        async for change in watch:
            honour_cancellation()
            self._apply(change)

    def _apply(self, change: Change) -> None:
        if change.value is None:
            self._store(change.key, None, 0)
            return
        if change.revision < self._revisions.get(change.key, 0):
            return  # our own newer write arrived first
        try:
            self._store(change.key, decode_as(change.value, BreakerRecord), change.revision)
        except DecodeError as exc:
            log.warning("ignoring unreadable breaker", key=change.key, error=str(exc))

    def _store(self, key: str, record: BreakerRecord | None, revision: int) -> None:
        old = self.records.pop(key, None)
        self._revisions.pop(key, None)
        if old is not None and (keys := self._tripped.get(old.agent_id)):
            keys.discard(key)
            if not keys:
                del self._tripped[old.agent_id]
        if record is None:
            return
        self.records[key], self._revisions[key] = record, revision
        if _tripped(record):
            self._tripped.setdefault(record.agent_id, set()).add(key)

    async def record_outcome(self, event: Event, at_ms: int) -> None:
        """Count one agent-reported outcome (``at_ms``: when the broker stored it). Not one
        of a forgotten agent (a restart reads the window's outcomes again): it would write
        a breaker back for an id nobody runs, and hand it to the next process of that id."""
        if not event.agent_id or not self._counts(event) or not self._registered(event.agent_id):
            return
        ok = event.event == "completed"
        agent_id, key = event.agent_id, breaker_key(event.agent_id, event.topic)
        live = at_ms >= self._live_from_ms
        await self._count_in_a_row(agent_id, event.message_id, ok, at_ms, judge=live)
        window = self._windows.setdefault(key, Window(self._config.window_s))
        window.add(at_ms, ok)
        for trial_key in (agent_id, key):
            await self._report_trial(trial_key, event.message_id, ok=ok)
        if not ok and live:
            await self._maybe_trip(key, agent_id, event.topic, window, at_ms)

    def forget(self, agent_id: str) -> None:
        """Drop the outcomes counted of an agent an operator forgot, so that a process that
        registers the id again starts with none (its records go as their keys are deleted)."""
        self._failures_in_a_row.pop(agent_id, None)
        for key in [k for k in self._windows if k.split(".", 1)[0] == agent_id]:
            del self._windows[key]

    async def _count_in_a_row(
        self, agent_id: str, message_id: str, ok: bool, at_ms: int, *, judge: bool
    ) -> None:
        """Isolate an agent after ``isolation_failures`` messages failed there in a row. The
        attempts of one message count once: one poison message retried, or one caller's bad
        input, says little about the agent, and isolating it refused every other topic."""
        isolation = self.records.get(agent_id)
        if isolation is not None and at_ms < isolation.counted_from_ms:
            return
        failed = self._failures_in_a_row.setdefault(agent_id, [])
        if ok:
            failed.clear()
            return
        if message_id in failed:
            return  # a retry of a message counted already
        if len(failed) < self._config.isolation_failures:
            failed.append(message_id)
        if len(failed) < self._config.isolation_failures or not judge:
            return
        reason = f"{len(failed)} messages failed in a row"

        def isolate(record: BreakerRecord | None) -> BreakerRecord | None:
            if record is not None and _tripped(record):
                return None
            base = record or BreakerRecord(agent_id=agent_id)
            return opened(base, self._clock(), reason, self._config)

        await self._transition(agent_id, isolate)

    async def _report_trial(self, key: str, message_id: str, *, ok: bool) -> None:
        record = self.records.get(key)
        if record is None or message_id not in record.trials:
            return

        def report(current: BreakerRecord | None) -> BreakerRecord | None:
            if current is None:
                return None
            now, needed = self._clock(), self._trials(key)
            return after_trial(
                current, message_id, ok=ok, now_ms=now, needed=needed, config=self._config
            )

        await self._transition(key, report)

    async def _maybe_trip(
        self, key: str, agent_id: str, intent: str, window: Window, at_ms: int
    ) -> None:
        record = self.records.get(key)
        if record is not None and record.state != "closed":
            return
        calls, errors = window.counts(at_ms, record.counted_from_ms if record else 0)
        reason = trip_reason(calls, errors, self._config)
        if reason is None:
            return

        def trip(current: BreakerRecord | None) -> BreakerRecord | None:
            if current is not None and current.state != "closed":
                return None
            base = current or BreakerRecord(agent_id=agent_id, intent=intent)
            return opened(base, self._clock(), reason, self._config)

        await self._transition(key, trip)

    async def _sweep_forever(self) -> None:
        """Open again half-open breakers whose trials never reported; close those of an
        agent that is gone (no trial would ever come, and it would count as isolated
        forever): a process that comes back starts afresh."""
        while True:
            await pause(SWEEP_S)
            now = self._clock()
            for key, record in list(self.records.items()):
                if _tripped(record) and (why := self._gone(record.agent_id)) is not None:
                    self._failures_in_a_row.pop(record.agent_id, None)
                    reason = f"the agent is {why}"
                    await self._transition(
                        key, lambda r, why=reason: lifted(r, self._clock(), why) if r else None
                    )
                elif overdue(record, now, self._config) is not None:
                    await self._transition(
                        key, lambda r: overdue(r, self._clock(), self._config) if r else None
                    )

    # -- writing ----------------------------------------------------------------------
    async def _transition(self, key: str, change: Transition) -> BreakerRecord | None:
        """Apply ``change`` with a conditional write, starting from this replica's view of
        the record and re-reading only after a lost race."""
        held = self.records.get(key)
        known = Entry(key, held, self._revisions.get(key, 0)) if held else None
        changed_from: list[BreakerRecord | None] = []

        def tracked(current: BreakerRecord | None) -> BreakerRecord | None:
            changed_from[:] = [current]
            return change(current)

        try:
            swap = await (await self._bucket()).cas(key, tracked, known=known, tries=5)
        except BrokerError as exc:
            log.warning("breaker write failed; leaving it", key=key, error=str(exc))
            return None
        entry = swap.entry
        if entry is not None and entry.value is not None:
            self._store(key, entry.value, entry.revision)  # ours, or what made us decline
        if not swap.written or entry is None:
            return None
        await self._announce(changed_from[0], entry.value)
        return entry.value

    async def _bucket(self) -> Bucket[BreakerRecord]:
        return await self._broker.bucket(self._broker.names.breakers_bucket, BreakerRecord)

    async def _announce(self, before: BreakerRecord | None, after: BreakerRecord) -> None:
        if before is not None and before.state == after.state:
            return
        kind = _EVENT_NAMES[_isolation(after)][after.state]
        log.info(kind, agent_id=after.agent_id, intent=after.intent, reason=after.reason)
        detail: dict[str, object] = {"reason": after.reason, "isolated_agents": len(self.isolated)}
        if after.intent:
            detail["intent"] = after.intent
        await emit(self._broker, agent_event(after.agent_id, kind, **detail))


_EVENT_NAMES = {
    False: {"open": "breaker_opened", "half_open": "breaker_half_open", "closed": "breaker_closed"},
    True: {"open": "agent_isolated", "half_open": "isolation_trial", "closed": "agent_restored"},
}


def _isolation(record: BreakerRecord) -> bool:
    return record.intent == WHOLE_AGENT


def _tripped(record: BreakerRecord) -> bool:
    return record.state != "closed"


def _refused_as_invalid(event: Event) -> bool:
    error = event.detail.get("error") if event.event == "failed" else None
    return isinstance(error, dict) and error.get("retryable") is False


def _dependency_failed(event: Event) -> bool:
    """A handler that failed because a task it sent failed (``sub_task_failed``): its
    dependency's health, not its own."""
    error = event.detail.get("error") if event.event == "failed" else None
    return isinstance(error, dict) and error.get("type") == SUB_TASK_FAILED


def _moved_away(event: Event) -> bool:
    """An attempt liveness moved to another agent, which this one reports unrun once back (a
    trial: a 20 s SIGSTOP made the only agent report its waiting tasks so, which isolated it,
    and every task after was dead-lettered, none of them run)."""
    error = event.detail.get("error") if event.event == "failed" else None
    return isinstance(error, dict) and error.get("type") == REASSIGNED


def _cut_short_ms(event: Event) -> int | None:
    """The execute budget a task had when its handler failed as ``deadline_exceeded``
    (None for every other outcome)."""
    error, task = event.detail.get("error"), event.detail.get("task")
    if not (isinstance(error, dict) and error.get("type") == DEADLINE_EXCEEDED):
        return None
    budget = task.get("budget") if isinstance(task, dict) else None
    execute_ms = budget.get("execute_ms") if isinstance(budget, dict) else None
    return execute_ms if isinstance(execute_ms, int) else Budget().execute_ms
