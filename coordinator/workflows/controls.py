"""Signals and cancels of an instance, from ``REACH_WORKFLOWS``: charged to their caller's
quota (:mod:`charges`), looked at again while their instance has not started, handled one
at a time per instance in the order the server stored them, and each signal taken once
(:mod:`taken`). An operator's (the bare subject) may act on any instance; a caller's (its
name the subject's last token, which permissions make its own) only on one it started."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import structlog

from agentreach.broker import Broker, Delivery
from agentreach.broker.streams import leader_next_message
from agentreach.coordinator.protection.quotas import CallerQuotas
from agentreach.coordinator.workflows.answers import cancelled_by, may_act
from agentreach.coordinator.workflows.charges import ControlCharges, Records, settled
from agentreach.coordinator.workflows.definitions import Definitions
from agentreach.coordinator.workflows.run import BY_OPERATOR, Run
from agentreach.coordinator.workflows.signals import Sent, look_again, signal_ignored, taken_said
from agentreach.coordinator.workflows.taken import Confirmed, handled_before, judged
from agentreach.coordinator.workflows.turns import Turns
from agentreach.envelopes import ErrorInfo
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.workflows")

# ``WorkflowEngine._apply``: apply a change to an instance's record, then its actions.
Apply = Callable[..., Awaitable[bool]]
NOT_TAKEN_SAID_PER_MINUTE = 5  # per instance: a flood of ignored signals is not a line each
# A signal waits for those of its instance stored before it and still in the stream (on
# another replica): looked at again after this long, twice as long each time after, at
# most ORDER_POLL_CAP_S apart (a burst goes at about one signal per poll), while the
# earliest of them leaves within ORDER_WAIT_S.
ORDER_POLL_FIRST_S = 0.002
ORDER_POLL_CAP_S = 0.02
ORDER_WAIT_S = 3.0


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What a signal came to: ``last`` is the latest signal judged before it came again."""

    kind: Literal["taken", "refused", "judged_before", "ignored"]
    started_by: str | None = None
    last: int = 0


class Controls:
    """Handles the signals and cancels of every instance."""

    def __init__(
        self,
        broker: Broker,
        apply: Apply,
        records: Records,
        definitions: Definitions,
        quotas: CallerQuotas | None,
    ) -> None:
        self._broker = broker
        self._apply = apply
        self._records = records
        self._definitions = definitions
        self._charges = ControlCharges(broker, quotas, records)
        self._in_order = Turns()  # a signal's first await: in the order delivered
        self._held = _Held()
        self._confirmed = Confirmed()
        self._not_taken = RepeatedLines(60.0, burst=NOT_TAKEN_SAID_PER_MINUTE)

    async def handle(self, msg: Delivery, kind: str, about: str) -> float | None:
        """None once ``msg`` (``kind`` ``signal`` or ``cancel``; ``about``, its subject from
        the instance id on) is done, or seconds until it is looked at again."""
        instance_id = about.partition(".")[0]
        if kind != "signal":
            return await self._in_turn(msg, kind, about)
        with self._held.holding(instance_id, msg.stream_seq):
            # Not inside the turn: an earlier signal delivered after this one (again, after
            # a failure) may wait for this one here.
            await self._in_stored_order(msg, instance_id)
            return await self._in_turn(msg, kind, about)

    async def _in_turn(self, msg: Delivery, kind: str, about: str) -> float | None:
        instance_id, _, rest = about.partition(".")
        async with self._in_order.turn(instance_id):  # first: in the order delivered
            if await self._charges.refused(kind, about, msg):
                return None  # over its caller's quota: answered, not acted on
            if await (await self._records()).get(instance_id) is None:
                return await look_again(self._broker, msg, kind, about)
            seen_before = msg.num_delivered > 1
            if kind == "signal":
                event, _, asker = rest.partition(".")  # a caller's form names it last
                sent = Sent(msg.timestamp_ms, msg.stream_seq, seen_before)
                await self._on_signal(instance_id, event, asker or None, sent)
            else:
                await self._on_cancel(instance_id, rest or None, msg.data, seen_before)
        # Past its turn: the next need not wait for this round trip. Until it is done, a
        # taken signal stays in the record (a crash before the server applied it loses it).
        await settled(msg)
        self._confirmed.add(instance_id, msg.stream_seq)
        return None

    async def _in_stored_order(self, msg: Delivery, instance_id: str) -> None:
        """Until no signal of the instance stored before ``msg`` is left in the stream (the
        work queue keeps one until it is acknowledged): the replicas share the consumer,
        and a later signal written first had the earlier ignored as superseded (a drill:
        115 of 453 flips with two replicas, no fault). Not once the earliest left stays
        ORDER_WAIT_S: its replica may have died (it comes back after the ack wait, and is
        superseded then)."""
        names, loop = self._broker.names, asyncio.get_running_loop()
        mine = names.workflow_signal(instance_id, ">")  # a caller's and the bare ones
        # The latest one held here first: it waited for those before it, so that a burst
        # costs a read per signal, not one per earlier signal (a flood went 20 times slower).
        after = await self._after_held_here(instance_id, 1, msg.stream_seq)
        pause, earliest, since = ORDER_POLL_FIRST_S, 0, loop.time()
        while True:
            # From the leader: a replica behind lacked signals stored the same millisecond
            # (an outside drill, on a 3-node cluster: one taken before two stored before it).
            oldest = await leader_next_message(self._broker, names.workflows_stream, mine, after)
            if oldest is None or oldest.stream_seq >= msg.stream_seq:
                return
            if (mark := await self._mark(instance_id)) >= oldest.stream_seq:
                after = mark + 1  # handled already, its acknowledgement not (yet) applied
                continue
            if oldest.stream_seq != earliest:  # progress: the next earlier one is waited for
                earliest, since = oldest.stream_seq, loop.time()
            elif loop.time() - since > ORDER_WAIT_S:
                _goes_ahead(instance_id, msg.stream_seq, earliest)
                return
            if self._held.latest_before(instance_id, earliest, msg.stream_seq) is not None:
                after = await self._after_held_here(instance_id, earliest, msg.stream_seq)
                continue
            await asyncio.sleep(pause)  # another replica's: nothing says when it is removed
            pause = min(ORDER_POLL_CAP_S, pause * 2)

    async def _after_held_here(self, instance_id: str, low: int, high: int) -> int:
        """Once the latest signal of the instance held here, stored from ``low`` and before
        ``high``, is done (it waited for those before it), the sequence after it; ``low``
        when none is, or it is not done within ORDER_WAIT_S."""
        if (held := self._held.latest_before(instance_id, low, high)) is None:
            return low
        seq, done = held
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), ORDER_WAIT_S)
        return seq + 1 if done.is_set() else low

    async def _mark(self, instance_id: str) -> int:
        """The latest signal the instance's record says was handled (0: no record)."""
        entry = await (await self._records()).get(instance_id)
        return entry.value.last_signal_seq if entry is not None else 0

    async def _on_signal(self, instance_id: str, event: str, asker: str | None, sent: Sent) -> None:
        """Move the instance's state on ``event``, unless it (or a later signal) was judged
        already; say what became of it."""
        verdict: list[_Verdict] = []  # the last try's (a conditional write may try again)
        outgrown: list[ErrorInfo] = []
        applied = self._confirmed.of(instance_id)

        def change(run: Run) -> bool:
            verdict.clear()
            record = run.record
            if not may_act(record, asker):
                verdict.append(_Verdict("refused", started_by=record.task.caller))
                return False
            if handled_before(record, sent.seq):
                verdict.append(_Verdict("judged_before", last=record.last_signal_seq))
                return False
            if run.on_signal(event, sent.at_ms, by=asker, seq=sent.seq, applied=applied):
                return True
            verdict.append(_Verdict("ignored"))
            return judged(record, sent.seq)

        def too_large(run: Run, error: ErrorInfo) -> bool:
            outgrown.append(error)
            return run.outgrow(error)

        written = await self._apply(instance_id, change, sent.again, too_large=too_large)
        said = verdict[-1] if verdict else _Verdict("taken")
        if said.kind == "taken" and written and not outgrown:
            return
        if said.kind == "refused":  # said to nobody else: not the asker's to know of
            log.warning(
                "signal refused: the instance is not the asker's",
                instance_id=instance_id,
                asker=asker,
                started_by=said.started_by or "an operator",
            )
            return
        if (entry := await (await self._records()).get(instance_id)) is None:
            return
        record = entry.value
        if said.last and await taken_said(self._broker, record, sent.seq):
            return  # taken before, and said so: delivered again since
        if not outgrown:
            self._say_not_taken(instance_id, event, said.last)
        spec = self._definitions.of(record)
        failed = outgrown[-1] if outgrown else None  # failed instead of taking it
        later = said.last if said.last != sent.seq else 0  # 0: itself, ignored before
        await signal_ignored(
            self._broker, record, spec, event, asker, sent.seq, failed, superseded_by=later or None
        )

    async def _on_cancel(
        self, instance_id: str, asker: str | None, data: bytes, seen_before: bool
    ) -> None:
        why = cancelled_by(asker, data[:200].decode(errors="replace"), BY_OPERATOR)
        refused: list[str] = []

        def change(run: Run) -> bool:
            if may_act(run.record, asker):
                return run.cancel(why)
            refused.append(run.record.task.caller or "an operator")
            return False

        await self._apply(instance_id, change, seen_before)
        if refused:
            log.warning(
                "cancel refused: the instance is not the asker's",
                instance_id=instance_id,
                asker=asker,
                started_by=refused[-1],
            )

    def _say_not_taken(self, instance_id: str, event: str, superseded_by: int) -> None:
        """A few times a minute per instance, with how many went unsaid since."""
        if (unsaid := self._not_taken.due(instance_id)) is None:
            return
        more = {"more_not_said": unsaid} if unsaid else {}
        line = "signal not taken: " + (
            "it, or a later one, was handled before (delivered again after a failure)"
            if superseded_by
            else "no state waits for it"
        )
        log.warning(line, instance_id=instance_id, signal=event, **more)


class _Held:
    """The signals being handled on this replica, by instance and stream sequence; each
    with the event set once it is done."""

    def __init__(self) -> None:
        self._of: dict[str, dict[int, asyncio.Event]] = {}

    @contextlib.contextmanager
    def holding(self, instance_id: str, seq: int) -> Iterator[None]:
        held = self._of.setdefault(instance_id, {})
        held[seq] = done = asyncio.Event()
        try:
            yield
        finally:
            done.set()
            if held.get(seq) is done:  # not a delivery of it again meanwhile
                del held[seq]
            if not held and self._of.get(instance_id) is held:
                del self._of[instance_id]

    def latest_before(
        self, instance_id: str, low: int, high: int
    ) -> tuple[int, asyncio.Event] | None:
        """The latest signal of the instance held here stored from ``low`` and before
        ``high``: its sequence and its event."""
        held = self._of.get(instance_id, {})
        if not (seqs := [seq for seq in held if low <= seq < high]):
            return None
        return max(seqs), held[max(seqs)]


def _goes_ahead(instance_id: str, seq: int, earlier: int) -> None:
    """Said of a signal handled before an earlier one of its instance: that one will be
    ignored as superseded when it comes back (a replica that died with it, or a handling
    that stalled past ORDER_WAIT_S, which a drill could then tell apart)."""
    log.warning(
        "signal handled before an earlier one of its instance, which did not leave in time:"
        " the earlier one will be ignored as superseded",
        instance_id=instance_id,
        signal_seq=seq,
        earlier_seq=earlier,
        waited_s=ORDER_WAIT_S,
    )
