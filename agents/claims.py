"""Exactly-once effect on top of at-least-once delivery: claim a message before running it.

The claim is a conditional write of this agent's record of the message in ``reach_executions``
(``<caller>.<message_id>.<agent_id>``: each agent writes only its own), so two deliveries of
one message to it (a redelivery, a republish) cannot both run it; across agents the
coordinator reads every agent's record of a message before dispatching it again. A claim is
a lease: if its holder dies, the message runs again once the lease has passed; one held by an
earlier process of the agent (a lower epoch) is taken over at once, and so is one of this
process that no delivery in hand holds (a write that landed though its answer was lost).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from agentreach.agents.claim_results import (
    AlreadyDone,
    AlreadyFailed,
    Busy,
    Claim,
    Claimed,
    Expired,
    Moved,
)
from agentreach.agents.drain import recording
from agentreach.broker import (
    BrokerError,
    Bucket,
    Entry,
    TooLarge,
    ValueTooLarge,
    WrongLastSequence,
)
from agentreach.broker.bucket import UNREAD
from agentreach.broker.errors import pause
from agentreach.broker.tasks import cancel_and_wait
from agentreach.envelopes import (
    DecodeError,
    ErrorInfo,
    Execution,
    PayloadRef,
    Task,
    execution_key,
    is_expiry_fence,
    moved_on_from,
    now_ms,
)
from agentreach.logs import get_logger

log = get_logger("agents.claims")

RECORD_TRIES = 6  # about 8 s of broker trouble before the delivery is handed back
RECORD_BACKOFF_S = 0.25
KEPT = 10_000  # outcomes waiting to be recorded, at most
BUSY_POLL_S = 0.5  # how often a delivery that waits for another one claims again


@dataclass(slots=True)
class Hand:
    """One delivery of a message in this process, from its claim to its recorded outcome;
    ``holds``: it won the claim (and runs the message, or records its outcome)."""

    message_id: str
    holds: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of a handler ended with: its result, or an error."""

    claim: Claimed
    result: Any = None
    error: ErrorInfo | None = None
    duration_ms: int = 0
    result_ref: PayloadRef | None = None  # the result, claim-checked when it was large
    past_deadline_ms: int | None = None  # the deadline its run went past (it could not stop)


class Claims:
    """This agent's claims and outcomes of messages, in a bucket shared by every agent."""

    def __init__(self, bucket: Bucket[Execution], agent_id: str, epoch: int) -> None:
        self._bucket = bucket
        self._agent_id = agent_id
        self._epoch = epoch
        # Outcomes not yet recorded (the broker failing): a redelivery answers from these
        # instead of running the handler a second time.
        self._unrecorded: OrderedDict[str, Outcome] = OrderedDict()
        # The deliveries of each message that hold its claim here now. A `running` record of
        # this process none holds is a claim whose write landed though its answer was lost
        # (its delivery gave up; its redelivery would wait out the lease). One a delivery
        # holds is never taken over, even past its lease (renewals failed while the server
        # was away, and the run goes on: it ran twice).
        self._holding: Counter[str] = Counter()

    @property
    def epoch(self) -> int:
        """This process's epoch: its registration number for the agent id."""
        return self._epoch

    def runs_here(self, message_id: str) -> bool:
        """Whether a delivery of ``message_id`` holds its claim in this process now."""
        return self._holding.get(message_id, 0) > 0

    @contextlib.contextmanager
    def in_hand(self, message_id: str) -> Iterator[Hand]:
        """Around claiming, running and recording a delivery of ``message_id``: while a
        delivery of it holds its claim here, another one waits for that claim."""
        hand = Hand(message_id)
        try:
            yield hand
        finally:
            if hand.holds:
                self._holding[message_id] -= 1
                if not self._holding[message_id]:
                    del self._holding[message_id]

    async def claim_when_free(
        self,
        task: Task,
        lease_ms: int,
        *,
        still_working: Callable[[], Awaitable[None]],
        first: bool = False,
        seal: str | None = None,
        hand: Hand | None = None,
    ) -> Claimed | AlreadyDone | Expired | Outcome:
        """:meth:`claim`, waiting here while another delivery holds the message (said once
        per wait), and calling ``still_working`` meanwhile. The wait is not a redelivery:
        a duplicate that came back through nak would count towards max_deliver and could
        dead-letter a message that completes. The other delivery's outcome, when it ran here
        and its record could not be written, is the answer: its lease would lapse meanwhile,
        and the message must not run a second time."""
        waited = False
        while True:
            claim = await self.claim(task, lease_ms, first=first, seal=seal, hand=hand)
            first = False
            if not isinstance(claim, Busy):
                return claim
            if (kept := self._unrecorded.get(task.message_id)) is not None:
                return kept
            if not waited:
                log.info("another delivery holds this message", retry_in_s=claim.retry_in_s)
                waited = True
            await still_working()
            await asyncio.sleep(min(claim.retry_in_s, BUSY_POLL_S))

    async def claim(
        self,
        task: Task,
        lease_ms: int,
        *,
        first: bool = False,
        seal: str | None = None,
        hand: Hand | None = None,
    ) -> Claim:
        """Take the right to run ``task``, unless it ran already or runs elsewhere.

        ``first``: this is the message's first delivery to this agent, so no record of it is
        expected and the claim is written without reading first (one round trip fewer); the
        write is conditional all the same, and a record that was there after all is read
        and judged as usual. ``seal``: the dispatch's, kept in the record. ``hand``: the
        delivery claiming, which holds the claim it wins until it leaves :meth:`in_hand`."""
        now = now_ms()
        mine = self._record(
            task, "running", lease_until_ms=now + lease_ms, seal=seal, started_ms=now
        )
        swap = await self._bucket.cas(
            self._key(task), lambda held: self._take(held, mine), known=None if first else UNREAD
        )
        if swap.written:
            assert swap.entry is not None
            if hand is not None:
                hand.holds = True
                self._holding[task.message_id] += 1
            started_ms = swap.entry.value.started_ms
            return Claimed(
                swap.entry.revision, mine.lease_until_ms, seal, started_ms, started_ms < now
            )
        held = swap.entry.value if swap.entry else None
        if held is not None and held.state == "done":
            return AlreadyDone(held)
        if held is not None and is_expiry_fence(held, task.attempt):
            return Expired(held)
        if held is not None and moved_on_from(held, task.attempt):
            return Moved(held)
        if held is not None and failed_in_life(held, task) and held.attempt == task.attempt:
            return AlreadyFailed(held)
        if held is not None and failed_in_life(held, task) and held.attempt > task.attempt:
            return Moved(held)  # a later attempt failed here: the coordinator moved on
        left_ms = held.lease_until_ms - now_ms() if held else 0
        return Busy(retry_in_s=max(left_ms, 100) / 1000)

    async def renew(self, task: Task, claim: Claimed, lease_ms: int) -> bool:
        """Extend the claim's lease to ``lease_ms`` from now (a handler that reports progress
        works on). False when the claim was taken away meanwhile (fenced): the handler's
        result will be refused; a broker failure is logged, the old lease stands."""
        until = now_ms() + lease_ms
        async with claim.lock:
            if until <= claim.lease_until_ms:
                return True
            record = self._record(
                task, "running", lease_until_ms=until, seal=claim.seal, started_ms=claim.started_ms
            )
            while True:
                try:
                    last = claim.revision
                    claim.revision = await self._bucket.update(self._key(task), record, last=last)
                    break
                except WrongLastSequence:
                    held = await self._bucket.last(self._key(task), after=last)
                    if not self._still_mine(held, task, claim):
                        return False
                except BrokerError as exc:
                    log.warning("lease not extended", error=str(exc))
                    return True
            claim.lease_until_ms = until
            return True

    @contextlib.asynccontextmanager
    async def kept(
        self, task: Task, claim: Claimed, *, lease_ms: int, every_s: float
    ) -> AsyncIterator[None]:
        """While the block runs, renew the claim to ``lease_ms`` from now every ``every_s``:
        work that cannot be stopped keeps the message its own, so that neither a redelivery
        nor the coordinator (which waits for a live lease) starts it again meanwhile."""
        renewing = asyncio.create_task(self._renewing(task, claim, lease_ms, every_s))
        try:
            yield
        finally:
            await cancel_and_wait(renewing)

    async def _renewing(self, task: Task, claim: Claimed, lease_ms: int, every_s: float) -> None:
        while True:
            if not await self.renew(task, claim, lease_ms):
                break
            await pause(every_s)
        log.warning("claim lost while running: this run's result will be refused")

    async def done(self, task: Task) -> Execution | None:
        """This agent's record of ``task`` when it says the message ran to its result."""
        try:
            held = await self._bucket.get(self._key(task))
        except DecodeError:
            return None  # unreadable: it proves nothing ran
        return held.value if held is not None and held.value.state == "done" else None

    def unrecorded(self, message_id: str) -> Outcome | None:
        """The outcome of a run of ``message_id`` that is still waiting to be recorded."""
        return self._unrecorded.get(message_id)

    async def record(
        self, task: Task, outcome: Outcome, *, still_working: Callable[[], Awaitable[None]]
    ) -> bool:
        """Write the outcome into the claim's record, trying again while the broker fails.

        The outcome is kept meanwhile, so a redelivery answers from it instead of running
        the handler again; after the last try the BrokerError is raised. Returns False when
        the claim was taken away (the task was reassigned) and a result must not be used.
        """
        self._unrecorded[task.message_id] = outcome
        recording(task.message_id)
        while len(self._unrecorded) > KEPT:
            self._unrecorded.popitem(last=False)
        for attempt in range(RECORD_TRIES):
            try:
                async with outcome.claim.lock:
                    written = await self._write(task, outcome)
                break
            except (ValueTooLarge, TooLarge):  # over the bucket's, or the server's, limit
                self._unrecorded.pop(task.message_id, None)
                raise  # trying again cannot help: see unrecordable()
            except BrokerError as exc:
                if attempt == RECORD_TRIES - 1:
                    raise
                if attempt == 0:
                    log.warning("outcome not recorded yet; kept and retried", error=str(exc))
                await asyncio.sleep(RECORD_BACKOFF_S * 2**attempt)
                with contextlib.suppress(BrokerError):
                    await still_working()
        self._unrecorded.pop(task.message_id, None)
        recording(task.message_id, recorded=True)
        return written

    def _take(self, held: Execution | None, mine: Execution) -> Execution | None:
        """``mine`` when the message is free to run here; None when it ran or runs elsewhere."""
        if held is not None and is_expiry_fence(held, mine.attempt):
            return None  # ended as expired, by its agent's report or the coordinator's pass
        if held is not None and moved_on_from(held, mine.attempt):
            return None  # moved to another agent: that attempt's run is the next one
        if held is not None and failed_in_life(held, mine) and held.attempt >= mine.attempt:
            return None  # this attempt ran here and failed (its report's ack was lost)
        if held is None or held.state == "failed":
            return mine  # a retry; an unreadable record must not block the message forever
        if held.state == "done":
            return None
        if (held.agent_id, held.epoch) == (self._agent_id, self._epoch):
            return mine if self._lost_write(mine.message_id) else None
        outlived = held.agent_id == self._agent_id and held.epoch < self._epoch
        if outlived or held.lease_until_ms <= now_ms():
            return _resumed(held, mine)  # its holder is gone: an earlier process, a lapsed lease
        return None

    def _lost_write(self, message_id: str) -> bool:
        """Whether a claim of this very process is one no delivery holds (its write landed
        though its answer was lost), nor an outcome waiting to be recorded: taken over at
        once. One a delivery holds is never, however long ago its lease ran out."""
        if self._holding[message_id] or message_id in self._unrecorded:
            return False
        log.info("taking over this process's own claim: its write's answer was lost")
        return True

    async def _write(self, task: Task, outcome: Outcome) -> bool:
        claim = outcome.claim
        # When its run began, kept in the outcome: a `completed` said from the record has its
        # duration.
        run = {"seal": claim.seal, "started_ms": claim.started_ms}
        if outcome.error is None:
            record = self._record(
                task, "done", result=outcome.result, result_ref=outcome.result_ref, **run
            )
        else:
            record = self._record(task, "failed", error=outcome.error, **run)
        try:
            await self._bucket.update(self._key(task), record, last=claim.revision)
        except WrongLastSequence:  # read past it (a replica behind said our try was not in)
            held = await self._bucket.last(self._key(task), after=claim.revision)
            if self._still_mine(held, task, claim):
                return await self._write(task, outcome)
            # Fenced (our lease lapsed, a reassignment), or an earlier try of ours landed.
            return held is not None and held.value is not None and _same_write(held.value, record)
        return True

    def _still_mine(self, held: Entry[Execution] | None, task: Task, claim: Claimed) -> bool:
        """Whether a write refused at ``claim``'s revision met this run's own claim (``held``),
        written again since: a renewal that timed out (the server away) and landed later,
        from the client's reconnect buffer; or nobody's write, unreadable (a server's answer
        aimed at the key: the outcome was never recorded, and the task was lost). The claim
        takes that revision (a later one is no claim)."""
        if held is None or held.revision <= claim.revision:
            return False
        if held.value is not None and not _same_write(held.value, self._record(task, "running")):
            return False
        claim.revision = held.revision
        return True

    def _key(self, task: Task) -> str:
        """Each agent writes only its own record of a message (permissions make it so)."""
        return execution_key(task.caller, task.message_id, self._agent_id)

    def _record(
        self, task: Task, state: Literal["running", "done", "failed"], **fields: Any
    ) -> Execution:
        return Execution(
            message_id=task.message_id,
            state=state,
            agent_id=self._agent_id,
            epoch=self._epoch,
            attempt=task.attempt,
            caller=task.caller,
            received_ms=task.received_ms,
            finished_at_ms=now_ms() if state != "running" else 0,
            **fields,
        )


def failed_in_life(held: Execution, of: Task | Execution) -> bool:
    """Whether ``held`` is a failure in the same life of the message as ``of`` (the same
    ``received_ms``): sent again past the intake's duplicate window, it runs again."""
    return held.state == "failed" and held.received_ms == of.received_ms


def _resumed(held: Execution, mine: Execution) -> Execution:
    """``mine``, taking over ``held``: a crashed run of the same attempt keeps its start."""
    if held.state != "running" or held.attempt != mine.attempt or not held.started_ms:
        return mine
    return msgspec.structs.replace(mine, started_ms=min(held.started_ms, mine.started_ms))


def _same_write(held: Execution, written: Execution) -> bool:
    def run(e: Execution) -> tuple[str, int, int, str]:
        return (e.agent_id, e.epoch, e.attempt, e.state)

    return run(held) == run(written)
