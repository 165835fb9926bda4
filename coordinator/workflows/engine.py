"""The workflow engine: the coordinator drives multi-agent work; agents never drive each other.

A task on ``reach.task.<workflow>`` starts an instance, keyed by its message id
in ``reach_workflows``. Its steps are ordinary tasks (so routing, retries and
idempotency apply) whose ``reply_to`` is ``reach.wf.reply.<instance>``; the
``REACH_WORKFLOWS`` stream keeps those replies, the timers
(``reach.wf.timer.<instance>``, held back by a delayed negative ack until due),
signals and cancels, and every coordinator replica shares one durable consumer
of it. Each message is applied to the record with a conditional write, then its
actions are carried out; a message seen again (the replica died in between)
repeats every action the record calls for, all of them idempotent.

A step whose intent is another workflow starts a child instance, whose id is the
step's message id: a step its instance stops waiting for (cancelled, timed out, or
the instance ended) is cancelled in turn, so nothing below a cancel dispatches more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import structlog

from agentreach import envelopes
from agentreach.broker import (
    Broker,
    BrokerError,
    Bucket,
    ClaimCheck,
    Delivery,
    TooLarge,
    ValueTooLarge,
    WrongLastSequence,
)
from agentreach.broker.failover import until_answered
from agentreach.broker.lifecycle import about, reply
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.protection.grants import Grants, reply_vouched
from agentreach.coordinator.protection.quotas import CallerQuotas
from agentreach.coordinator.protection.server_answers import ServerAnswers
from agentreach.coordinator.workflows.answers import (
    answer_again,
    refused_as_taken,
)
from agentreach.coordinator.workflows.controls import Controls
from agentreach.coordinator.workflows.deadline import new_record
from agentreach.coordinator.workflows.definitions import Definitions, warn_of_unused_parts
from agentreach.coordinator.workflows.nesting import check_nesting
from agentreach.coordinator.workflows.outbox import Outbox
from agentreach.coordinator.workflows.payloads import inline_payload
from agentreach.coordinator.workflows.records import HotRecords, outgrown_error
from agentreach.coordinator.workflows.run import Run
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.coordinator.workflows.timers import LATER_S, news_before
from agentreach.coordinator.workflows.turns import StoredOrder
from agentreach.coordinator.workflows.unreadable import refuse
from agentreach.envelopes import (
    Ack,
    DecodeError,
    ErrorInfo,
    ErrorReply,
    Result,
    Task,
    TimerDue,
    WorkflowRecord,
    decode_as,
    now_ms,
    refuse_server_answers,
)

log = structlog.get_logger("coordinator.workflows")


class WorkflowEngine:
    """Starts and advances workflow instances; any replica can take any message. Raises
    :class:`ConfigError` when a workflow runs itself, directly or through others."""

    def __init__(
        self,
        broker: Broker,
        specs: Mapping[str, WorkflowSpec],
        clock: Callable[[], int] = now_ms,
        grants: Grants | None = None,
        quotas: CallerQuotas | None = None,
    ) -> None:
        check_nesting(specs)
        warn_of_unused_parts(specs)
        self._broker = broker
        self.specs = dict(specs)
        self._definitions = Definitions(self.specs)  # each instance runs on its own
        self._clock = clock
        self._grants = grants or Grants(None)  # with a seal key, step results are checked
        # Large step results are fetched to map them; a starting task's stowed payload too.
        self._claim_check = ClaimCheck(broker)
        self._server_answers = ServerAnswers()
        self._hot = HotRecords()  # what this replica wrote last: the next change reads nothing
        self._stored_order = StoredOrder()
        self._controls = Controls(broker, self._apply, self._records, self._definitions, quotas)
        self._outbox = Outbox(broker, self._definitions.children, clock)

    def serves(self, topic: str) -> bool:
        return topic in self.specs

    async def started(self, task: Task) -> bool:
        """Whether ``task`` starts (or started) an instance of a workflow no longer
        configured: sent again, it is answered as its instance ends (or ended); a running
        instance's step starts it as a child by the definition its parent kept. Neither is
        routed as a task no agent serves (its sender would be told that nothing ran)."""
        if task.topic not in self._definitions.retired:
            return False
        entry = await (await self._records()).get(task.message_id)
        if entry is not None:
            return entry.value.workflow == task.topic
        parent = await self._parent(task)
        return parent is not None and self._definitions.child_of(parent, task.topic) is not None

    # -- starting ---------------------------------------------------------------------
    async def start(self, task: Task, *, seen_before: bool) -> None:
        """Create the instance of ``task`` (once) and dispatch its first steps."""
        spec = self.specs.get(task.topic)
        calls = self._definitions.calls_of(task.topic) if spec else None
        if spec is None and (parent := await self._parent(task)) is not None:
            spec, calls = self._definitions.child_of(parent, task.topic), parent.calls
        if spec is None:  # no longer configured: only its instances' starters come here
            await self._started_again(task, seen_before)
            return
        if (task := await inline_payload(self._broker, self._claim_check, task)) is None:
            return
        record = new_record(task.topic, task, spec, self._clock(), calls)
        run = Run(spec, record, self._clock(), self._definitions.children(record))
        run.start()
        records = await self._records()
        try:
            revision = await records.create(record.instance_id, record)
        except WrongLastSequence:
            await self._started_again(task, seen_before)
            return
        except (TooLarge, ValueTooLarge) as exc:  # every run of it would be: said at once
            await end_with_error(
                self._broker, task, "rejected", outgrown_error(exc), ran=False, started=False
            )
            return
        self._hot.keep(record.instance_id, record, revision)
        await reply(self._broker, task, Ack(**about(task)))
        # Asked once the record exists, so a cancel of the parent after this read finds it.
        if parent := await self._parent_ended(task):
            why = f"cancelled with its parent workflow {parent!r}"
            await self._apply(record.instance_id, lambda run: run.cancel(why), False)
            return
        await self._outbox.carry_out(record, run.actions)

    async def _started_again(self, task: Task, seen_before: bool) -> None:
        """The starting task of an instance that exists, sent again (or seen again)."""
        if (existing := await (await self._records()).get(task.message_id)) is None:
            return
        if await refused_as_taken(self._broker, existing.value, task):
            return
        if existing.value.finished and not seen_before:  # sent again, past the dup window
            await answer_again(self._broker, existing.value, task)
            return
        log.info("workflow exists already; resuming", instance_id=task.message_id)
        await self._resume(existing.value)

    async def _parent_ended(self, task: Task) -> str | None:
        """The id of the instance whose step ``task`` is, when that instance no longer runs
        (cancelled or ended while the step waited in intake)."""
        parent = await self._parent(task)
        return parent.instance_id if parent is not None and parent.status != "running" else None

    async def _parent(self, task: Task) -> WorkflowRecord | None:
        """The record of the instance whose step ``task`` is, if it is one."""
        names = self._broker.names
        if task.reply_to is None or not names.workflow_replies(task.reply_to):
            return None
        entry = await (await self._records()).get(
            task.reply_to.removeprefix(names.workflow_reply(""))
        )
        return entry.value if entry is not None else None

    # -- the REACH_WORKFLOWS consumer -------------------------------------------------
    async def handle(self, msg: Delivery) -> float | None:
        """None to acknowledge ``msg``, or seconds until it should come back (a timer)."""
        names = self._broker.names
        kind, _, rest = msg.subject[len(names.prefix) + len(".wf.") :].partition(".")
        instance_id = rest.partition(".")[0]
        seen_before = msg.num_delivered > 1
        try:
            refuse_server_answers(msg.data, msg.headers, msg.subject, headed=True)
            async with self._stored_order.after_earlier(instance_id, msg.stream_seq):
                return await self._handle(msg, kind, instance_id, rest, seen_before)
        except DecodeError as exc:
            await refuse(self._broker, msg, instance_id, exc, self._server_answers)
        return None

    async def _handle(
        self, msg: Delivery, kind: str, instance_id: str, rest: str, seen_before: bool
    ) -> float | None:
        match kind:
            case "reply":
                return await self._on_reply(msg, instance_id, seen_before)
            case "timer":  # a timer comes back by design: not a sign of a crash
                return await self._on_timer(instance_id, msg.data)
            case "signal" | "cancel":
                return await self._controls.handle(msg, kind, rest)
            case _:
                raise DecodeError(f"no workflow message kind {kind!r}", path="subject")

    async def _on_reply(self, msg: Delivery, instance_id: str, seen_before: bool) -> float | None:
        """None once the reply is applied (or refused), or seconds until it is looked at
        again (a secured deployment checks that the step's attempt was routed to its sender:
        anyone may publish as itself to the reply subject of a workflow it was in)."""
        answer = envelopes.decode_reply(msg.data)
        if not isinstance(answer, Result | ErrorReply):
            return None  # an ack or progress of a step: nothing to decide
        if self._grants.enabled:
            vouched = await reply_vouched(self._broker, msg, answer)
            if vouched is not True:
                return None if vouched is False else vouched
        if isinstance(answer, Result):
            output = await self._claim_check.result_of(answer.result, answer.result_ref)
            error = None
        else:
            output, error = None, answer.error
        message_id = answer.message_id
        await self._apply(
            instance_id,
            lambda run: run.on_result(message_id, output=output, error=error),
            seen_before,
            too_large=lambda run, why: run.outgrown_by(message_id, why),
        )
        return None

    async def _on_timer(self, instance_id: str, data: bytes) -> float | None:
        due = decode_as(data, TimerDue)
        wait_ms = due.due_ms - self._clock()
        if wait_ms > 0:
            return wait_ms / 1000
        if await news_before(self._broker, instance_id, due.due_ms, self._clock()):
            return LATER_S  # a reply or a signal stored in time goes first
        await self._apply(instance_id, lambda run: run.on_timer(due.key, due.visit), False)
        return None

    # -- applying -----------------------------------------------------------------------
    async def _apply(
        self,
        instance_id: str,
        change: Callable[[Run], bool],
        seen_before: bool,
        *,
        too_large: Callable[[Run, ErrorInfo], bool] = Run.outgrow,
        outgrown: bool = False,
    ) -> bool:
        """Apply ``change`` to the instance with a conditional write, then its actions;
        False when it changed nothing. One that outgrows a message fails the instance
        (``too_large`` instead)."""
        runs: list[Run] = []

        def advance(record: WorkflowRecord | None) -> WorkflowRecord | None:
            runs.clear()
            if record is None:  # maybe a replica behind: said once the leader agrees
                return None
            spec = self._definitions.of(record)
            if spec is None:
                return None
            run = Run(spec, record, self._clock(), self._definitions.children(record))
            runs.append(run)
            return record if change(run) else None

        try:
            swap = await self._hot.cas(await self._records(), instance_id, advance)
        except (TooLarge, ValueTooLarge) as exc:
            if outgrown:
                raise
            error = outgrown_error(exc)
            log.error("workflow record too large: the instance fails", error=error.message)
            return await self._apply(
                instance_id, lambda r: too_large(r, error), False, outgrown=True
            )
        except BrokerError:  # the write may have been applied, and its actions not done
            self._outbox.owe(instance_id)
            raise
        if swap.entry is None:
            log.warning("message for an unknown workflow instance", instance_id=instance_id)
        if not runs:
            return False
        run = runs[-1]
        # Maybe applied just before a crash, or its actions cut short: do all it calls for.
        if owed := self._outbox.owes(instance_id) or (seen_before and not swap.written):
            run.resume()
        if swap.written or owed:
            await self._outbox.carry_out(run.record, run.actions, settles=owed)
        return swap.written

    async def _records(self) -> Bucket[WorkflowRecord]:
        return await self._broker.bucket(self._broker.names.workflows_bucket, WorkflowRecord)

    async def _resume(self, record: WorkflowRecord) -> None:
        spec = self._definitions.of(record)
        if spec is None:
            return
        run = Run(spec, record, self._clock(), self._definitions.children(record))
        run.resume()
        await self._outbox.carry_out(record, run.actions, settles=True)

    async def resume_after_outages(self) -> None:
        """Each time the connection comes back from the server, do all the record calls for
        of each instance whose actions a broker failure cut short here: a server killed -9
        may deliver the message that made the change again as new to another replica, which
        finds nothing to change, and the instance waited for its deadline. Only those:
        sending again the steps of every instance changed lately ran some twice (a chaos
        run, 12 after one kill: the server forgets the ids of consumed messages)."""
        seen = self._broker.reconnects
        while True:
            seen = await self._broker.link.came_back(seen)
            await until_answered(self._settle_owed, waiting_for="the workflow records")

    async def _settle_owed(self) -> None:
        records = await self._records()
        for instance_id in self._outbox.owed():
            if (entry := await records.get(instance_id)) is None:
                self._outbox.settled(instance_id)
                continue
            log.info("workflow resumed after an outage cut it short", instance_id=instance_id)
            await self._resume(entry.value)

    async def resume_all(self) -> int:
        """Repeat what every unfinished instance calls for (idempotent); how many there were.

        Each one is read again just before: while the snapshot is worked through, the
        replicas' consumers (this one's too) go on applying cancels and replies, and an
        instance ended since must not have its steps dispatched and its deadline armed
        again (past the duplicate window the steps would run again, after its end)."""
        records = await self._records()
        snapshot = await records.snapshot()
        for entry in snapshot.values():
            self._definitions.seen(entry.value)
        listed = [
            key
            for key, entry in snapshot.items()
            if not entry.value.finished
            and (entry.value.definition_id or entry.value.workflow in self.specs)
        ]
        resumed = 0
        for key in listed:
            try:
                entry = await records.get(key)
            except DecodeError:  # overwritten since the snapshot: no longer one to resume
                continue
            if entry is None or entry.value.finished:
                continue
            await self._resume(entry.value)
            resumed += 1
        if resumed:
            log.info("unfinished workflows resumed", count=resumed)
        return resumed
