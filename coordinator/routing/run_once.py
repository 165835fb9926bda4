"""Run-once across agents: before a message is dispatched (again), every agent's record of
it is read. A run that finished answers from its stored result instead of running again;
a run still under a live lease is waited for, never past the task's ttl and a margin. Each
agent writes only its own records, so this look across them is the coordinator's; on a
secured deployment it believes only records sealed for an attempt it gave (an agent could
write, under its own key, a result or a lease for any message)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
import structlog

from agentreach.broker import Broker, Bucket, Entry
from agentreach.broker.endings import Sent, difference
from agentreach.broker.lifecycle import (
    GRANT_HEADER,
    about,
    agent_event,
    emit,
    event_for,
    events_of,
    events_of_id,
    reply,
)
from agentreach.broker.topology import EVENTS_DUPLICATE_WINDOW_S
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.protection.grants import Grants
from agentreach.envelopes import (
    REASSIGNED,
    DecodeError,
    ErrorInfo,
    Event,
    Execution,
    Result,
    Task,
    executions_of,
    executions_of_any_caller,
    is_expiry_fence,
    now_ms,
    stable_id,
)
from agentreach.envelopes.audit import summary_of_task

log = structlog.get_logger("coordinator.run_once")

WAIT_CAP_S = 1.0
# A running record whose lease passed counts as running until this long after the
# connection came back from a server that could not be reached, or this replica first
# reached it (it cannot tell whether the server was away just before): no lease could be
# renewed meanwhile, and a live agent reconnects (within about 2 s of the server's return)
# and records the outcome it kept. Without it, a task an agent had just finished when the
# server was killed ran again on another agent (chaos runs).
OUTAGE_GRACE_S = 10.0
# A lease counts at most this long past the task's ttl and execute budget (the agent's
# grace to record its outcome, clock skew): a lease of a day would hold the message, and
# intake, for a day.
LEASE_PAST_TTL_MS = 30_000
# A later run's report of an attempt made this soon after the first report was stored has
# the first's Nats-Msg-Id, and the stream drops it (less a margin for the agent's clock).
REPORTED_AS_ONE_MS = int(EVENTS_DUPLICATE_WINDOW_S * 1000) - 10_000
TAKEN_FROM_ITS_AGENT = "the attempt was taken from its agent"  # a report that no longer counts
ALERTS_PER_READ = 5  # records found unsealed in one read that are alerted, the latest


@dataclass(frozen=True, slots=True)
class RanAlready:
    """The message finished on an agent: this is its record (with the result)."""

    record: Execution


@dataclass(frozen=True, slots=True)
class Running:
    """An agent runs the message now, under a lease that ends in ``left_s``."""

    left_s: float


Verdict = RanAlready | Running | None


class RunOnce:
    """Reads the agents' records of a message (one batched read)."""

    def __init__(self, broker: Broker, grants: Grants | None = None) -> None:
        self._broker = broker
        self._grants = grants or Grants(None)
        self._bucket: Bucket[Execution] | None = None

    async def verdict(self, task: Task, ttl_end_ms: int | None = None) -> Verdict:
        """What the records say of ``task``: finished, running elsewhere, or free to run
        (``ttl_end_ms``: see :func:`lease_limit`)."""
        records, until_ms = await self.records(task), lease_limit(task, ttl_end_ms)
        return verdict_of(records, until_ms=until_ms, grace_until_ms=self._grace_until_ms())

    def _grace_until_ms(self) -> int:
        """Until when a passed lease still counts after an outage (0: it does not)."""
        back_at = self._broker.link.back_at
        left_s = OUTAGE_GRACE_S - (time.monotonic() - back_at) if back_at else 0.0
        return now_ms() + int(left_s * 1000) if left_s > 0 else 0

    async def records(self, task: Task) -> list[Execution]:
        """Every agent's record of ``task``'s message that its seal vouches for."""
        found = await (await self._records()).matching(_keys_of(task))
        records, unsealed = [], []
        for key, entry in found.items():
            if self._grants.sealed(entry.value, key):
                records.append(entry.value)
            else:
                unsealed.append(entry)
        if unsealed:
            await self._said_unsealed(unsealed)
        return records

    def vouch(self, task: Task, agent_id: str, headers: Mapping[str, str]) -> None:
        """Raise DecodeError unless ``headers`` carry the grant ``task`` was dispatched to
        ``agent_id`` with (always holds without a seal key). A task someone had the server
        copy onto an agent's queue carries none: moved on, it was the coordinator's own
        task, in another caller's name, answered to a box of the forger's choice."""
        if not self._grants.holds(headers.get(GRANT_HEADER), task, agent_id):
            raise DecodeError(f"no grant of the coordinator's for {agent_id} on this dispatch")

    async def _said_unsealed(self, unsealed: list[Entry[Execution]]) -> None:
        """Said once per read, and alerted for the latest few: an agent wrote 20,000 keys
        under the id of a task with `replay_of` (whose read takes every sender's), and each
        such task made 20,000 alerts and log lines (a security re-test)."""
        latest = sorted(unsealed, key=lambda entry: entry.revision)[-ALERTS_PER_READ:]
        why = "execution records without the seal of an attempt given to them"
        log.warning("records not believed", count=len(unsealed), latest=[e.key for e in latest],
                    why=why)  # fmt: skip
        for entry in latest:
            await self._unsealed(entry)

    async def _unsealed(self, entry: Entry[Execution]) -> None:
        key, record = entry.key, entry.value
        sender = key.rsplit(".", 1)[-1]
        why = "an execution record without the seal of an attempt given to it"
        # One alert per written record, however often it is looked at (each look at the
        # message, by every replica): the stream drops the others within its dedup window.
        alert_id = stable_id(entry.written_ms * 1_000_000, "unsealed", key, entry.revision)
        alert = agent_event(
            sender,
            "alert",
            problem="impersonation",
            why=why,
            claimed=record.agent_id,
            kind="execution",
            message_id=record.message_id,
        )
        await emit(self._broker, msgspec.structs.replace(alert, message_id=alert_id))

    async def _records(self) -> Bucket[Execution]:
        if self._bucket is None:
            names = self._broker.names
            self._bucket = await self._broker.bucket(names.executions_bucket, Execution)
        return self._bucket


def _keys_of(task: Task) -> str:
    """A replay's records whoever sent it: a replay of a letter made again, by another
    replayer, after the first stopped before recording it (a worker as itself, then an
    operator bare) is the same message (its id is the letter's replay id) and must not run
    twice. Any other message: its sender's alone (one caller's id never meets another's)."""
    if task.replay_of is not None:
        return executions_of_any_caller(task.message_id)
    return executions_of(task.caller, task.message_id)


def verdict_of(
    records: list[Execution], *, until_ms: int | None = None, grace_until_ms: int = 0
) -> Verdict:
    """Finished (a ``done`` record), running (the longest live lease, each at least until
    ``grace_until_ms``, counted no later than ``until_ms``), or free to run."""
    now = now_ms()
    running = 0
    for record in records:
        if record.state == "done":
            return RanAlready(record)
        lease_until_ms = max(record.lease_until_ms, grace_until_ms)
        lease_until_ms = min(lease_until_ms, until_ms or lease_until_ms)
        if record.state == "running" and lease_until_ms > now:
            running = max(running, lease_until_ms - now)
    return Running(running / 1000) if running else None


def began(records: list[Execution], agent_id: str | None, attempt: int) -> bool:
    """Whether ``agent_id`` began a run of ``attempt``: its record of it exists (a claim)."""
    return any(r.agent_id == agent_id and r.attempt == attempt for r in records)


def lease_limit(task: Task, ttl_end_ms: int | None = None) -> int | None:
    """The latest a lease of ``task`` counts until: a run may begin until its ttl runs out
    (``ttl_end_ms``) and then run for its execute budget, and a margin; None when neither is
    known. A dispatch carries what was left of the ttl when it was routed, so its ttl ends
    ``ttl_ms`` after the dispatch: without that time, ``received_ms + ttl_ms`` is too early
    for any attempt routed late (a retry) — a running retry was ended as `expired`, "went
    silent", and its replay ran beside it."""
    end_ms = ttl_end_ms or (task.received_ms + task.ttl_ms if task.received_ms else 0)
    if not end_ms:
        return None
    return end_ms + task.budget.execute_ms + LEASE_PAST_TTL_MS


def superseded(
    records: list[Execution],
    agent_id: str | None,
    attempt: int,
    reported_at_ms: int,
    stored_ms: int,
    received_ms: int = 0,
    kind: str = "failed",
) -> str | None:
    """Why what ``agent_id`` reported at ``reported_at_ms`` of ``attempt`` (the report
    stored at ``stored_ms``) no longer counts, if it does not: a later attempt was
    dispatched since; the attempt was taken from the agent (it went OFFLINE and the task was
    reassigned); or a later run of the attempt by the same agent (a redelivery that took a
    stalled run over, or ran it again after a server restart) failed since, and reports that
    itself (a record is written before its report, on the agent's clock) — unless that
    report has this one's Nats-Msg-Id within the stream's duplicate window: the stream
    drops it, and this one stands for both (left alone, the task was never retried); or,
    for a ``failed`` report (``kind``), the coordinator ended the attempt as expired first.

    Records that ended before the task was taken in (``received_ms``) are of an earlier life
    of its message id (sent again past the duplicate window after it ended): they say
    nothing of this one (its attempt 1 failing elsewhere was left alone as "attempt 3 was
    dispatched since", and the task stayed without an end)."""
    for r in records:
        if r.state != "running" and 0 < r.finished_at_ms < received_ms:
            continue
        if r.attempt > attempt:
            return f"attempt {r.attempt} was dispatched since"
        if r.agent_id != agent_id or r.attempt != attempt or r.state != "failed":
            continue
        if r.error is not None and r.error.type == REASSIGNED:
            return TAKEN_FROM_ITS_AGENT
        if kind == "failed" and is_expiry_fence(r, attempt):  # retried, it ran again, ended twice
            return "the coordinator ended the attempt as expired: it was not reported in time"
        if r.finished_at_ms > max(reported_at_ms, stored_ms + REPORTED_AS_ONE_MS):
            return "a later run of the attempt failed since, and reports for itself"
    return None


async def other_request(broker: Broker, task: Task) -> str | None:
    """What differs between ``task``, a new life of its message id (sent again past the
    duplicate window), and the request its caller first sent under that id, as their first
    ``routed`` events record it; None when one of them is the same, or none says. (A retry
    or a redelivery is of the same life: compared only on attempt 1, whose topic no rule
    has replaced yet.)"""
    if task.attempt > 1:
        return None
    sent = Sent(task.topic, summary_of_task(task).sha256)
    firsts = [
        e
        for e in await events_of_id(broker, task.message_id)
        if e.event == "routed" and e.attempt == 1 and e.caller == task.caller
    ]
    differences = [difference(routed, sent) for routed in firsts]
    if not differences or None in differences:
        return None
    return (
        f"message id {task.message_id!r} is of an earlier request of yours, which {differences[-1]}"
    )


async def answer_from_record(broker: Broker, task: Task, record: Execution) -> None:
    """The message ran already (a republish, a retry or a redelivery after its result was
    recorded): its stored result answers, and nothing runs again. Unless ``task`` is another
    request under the id: then it ends refused as ``duplicate_id`` (its letter replays it
    under an id of its own)."""
    if differs := await other_request(broker, task):
        message = f"{differs}: send it under an id of its own (that one's result is not its)"
        error = ErrorInfo(type="duplicate_id", message=message, retryable=False)
        await end_with_error(broker, task, "rejected", error, started=False)
        return
    log.info("ran already; answering from its record", agent_id=record.agent_id)
    # A stored result answers only its own sender. Another's record is found for a replay
    # (any replayer's run of the letter is the one run), and anyone may say `replay_of`: an
    # agent read alice's result so, in its own trace, under her message id.
    own = record.caller == task.caller
    if own:
        answer = Result(
            **about(task, from_agent=record.agent_id),
            result=record.result,
            result_ref=record.result_ref,
        )
        await reply(broker, task, answer)
    await emit(broker, event_for(task, "answered_from_record", agent_id=record.agent_id))
    if not await _ended(broker, task):
        # Its agent died between recording the result and saying `completed`: said for it,
        # or the message would never end (no audit record, never counted finished).
        await emit(broker, recorded_completion(task, record, with_result=own))


async def _ended(broker: Broker, task: Task) -> bool:
    """Whether an authentic ending of ``task``'s message is stored."""
    events = await events_of(broker, task.trace_id, task.message_id)
    run = events.run_of(broker.names, task.caller)  # another caller's ending is not its
    return any(e.event in ("completed", "dead_lettered") for _, e in run)


def recorded_completion(task: Task, record: Execution, *, with_result: bool = True) -> Event:
    """The ``completed`` event of a run that recorded its result and said nothing more;
    ``with_result`` False for another sender's run: its result (and how long it took) is not
    ``task``'s to see."""
    result = {"result_ref": msgspec.to_builtins(record.result_ref)} if record.result_ref else {}
    if not with_result:
        result = {"result_withheld": "the run was another sender's"}
    # An outcome's record need not say when its run began (older SDKs' do not): no duration
    # then, rather than the time since 1970.
    took = record.finished_at_ms - record.started_ms
    timed = {"duration_ms": max(0, took)} if record.started_ms and with_result else {}
    return event_for(
        task,
        "completed",
        agent_id=record.agent_id,
        from_record=True,
        **timed,
        **(result or {"result": record.result}),
    )
