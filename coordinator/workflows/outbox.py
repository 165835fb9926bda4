"""What the engine does for a run's actions: publish step tasks, timers and notes, let go
of steps the instance no longer waits for, and answer the starter at the end.

A step let go (:class:`Abandon`) that is another workflow is cancelled in turn; one that
waits for a person in a manual-review queue has its item withdrawn, so that nobody answers
for a workflow that no longer waits (a late answer is refused, naming the workflow).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError
from agentreach.broker.direct import messages_on
from agentreach.broker.lifecycle import event_for, event_message
from agentreach.broker.streams import delete_message
from agentreach.coordinator.routing.manual import withdraw
from agentreach.coordinator.workflows.actions import Abandon, Action, Dispatch, Finish, Note, Timer
from agentreach.coordinator.workflows.answers import answer
from agentreach.coordinator.workflows.control import cancel
from agentreach.coordinator.workflows.nesting import child_headers
from agentreach.envelopes import (
    StepRun,
    Task,
    TimerDue,
    WorkflowRecord,
    WorkflowStep,
    tracecontext,
)
from agentreach.envelopes import headers as h
from agentreach.envelopes.coordination import step_abandoned, step_of

log = structlog.get_logger("coordinator.workflows")

# The events that end an instance: they carry its duration.
_ENDINGS = frozenset({"workflow_completed", "workflow_failed", "workflow_cancelled"})


class Outbox:
    """Carries out the actions of one change of an instance, in order (each idempotent)."""

    def __init__(
        self,
        broker: Broker,
        children: Callable[[WorkflowRecord], Collection[str]],
        clock: Callable[[], int],
    ) -> None:
        self._broker = broker
        self._children = children  # the workflows an instance's steps start as children
        self._clock = clock
        # Instances whose actions a broker failure cut short after their record's write: a
        # server that dies so may deliver the message that called for them again as new,
        # which finds nothing left to change (a step's task never sent, the instance stuck
        # until its deadline). The next change of the instance does all it calls for.
        self._owed: set[str] = set()

    def owe(self, instance_id: str) -> None:
        self._owed.add(instance_id)

    def owes(self, instance_id: str) -> bool:
        return instance_id in self._owed

    def owed(self) -> list[str]:
        return sorted(self._owed)

    def settled(self, instance_id: str) -> None:
        self._owed.discard(instance_id)

    async def carry_out(
        self, record: WorkflowRecord, actions: list[Action], *, settles: bool = False
    ) -> None:
        """Carry ``actions`` out; ``settles``: they are all the record calls for, and pay
        what the instance was owed."""
        try:
            await self._each(record, actions)
        except BrokerError:
            self._owed.add(record.instance_id)
            raise
        if settles:
            self._owed.discard(record.instance_id)

    async def _each(self, record: WorkflowRecord, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Dispatch(run=run, unless_routed=once):
                    if not once or not await self._routed(record, run):
                        await self._dispatch(record, run)
                case Timer(key=key, visit=visit, due_ms=due_ms):
                    await self._arm(record, key, visit, due_ms)
                case Note(event=event, key=key, detail=detail, unless_sent=once):
                    await self._note(record, event, key, detail, once=once)
                case Abandon(run=run) if run.intent in self._children(record):
                    # A child workflow's instance id is its step's message id.
                    why = f"cancelled with its parent workflow {record.instance_id!r}"
                    await cancel(self._broker, run.message_id, why=why)
                case Abandon(key=key, run=run):
                    await self._let_go(record, key, run)
                case Finish(again=again):
                    if not again or not await self._ending_said(record):
                        await answer(self._broker, record)
        if any(isinstance(action, Finish) for action in actions):
            # Last: the caller and the ending's event need not wait for it.
            await self._drop_timers(record.instance_id)

    async def _dispatch(self, record: WorkflowRecord, run: StepRun) -> None:
        task = self._step_task(record, run)
        # A refused publish (its intake subject full) leaves the message that called for the
        # step to come back, which dispatches it again, until the workflow's deadline.
        subject = self._broker.names.coordinator_task(task.topic)
        await self._broker.publish(subject, envelopes.encode(task), headers=h.task_headers(task))

    def _step_task(self, record: WorkflowRecord, run: StepRun) -> Task:
        """The task of one step visit, answering to the instance's reply subject. It may run
        for its ``timeout_s`` (within the workflow's deadline); a step without one, for the
        starting task's execute budget, as before each retry. A compensation undoes work
        after the deadline too: it has the starting task's ttl and budget, from now."""
        now = self._clock()
        left_ms = max(1, record.deadline_ms - now)
        execute_ms = min(left_ms, record.task.budget.execute_ms)
        child = run.intent in self._children(record)
        if run.deadline_ms:
            left_ms = max(1, min(left_ms, run.deadline_ms - now))
            # A child's ttl ends it by the step's timeout; its budget is its undos' too.
            execute_ms = record.task.budget.execute_ms if child else left_ms
        payload = run.input
        if (undone := _undone_by(record, run)) is not None:
            left_ms, execute_ms = record.task.ttl_ms, record.task.budget.execute_ms
            done = record.run_of(undone)
            payload = {"step": step_of(undone), "input": done.input, "output": done.output}
        return Task(
            v=1,
            message_id=run.message_id,
            trace_id=record.trace_id,
            topic=run.intent or record.workflow,
            payload=payload,
            reply_to=self._broker.names.workflow_reply(record.instance_id),
            priority=run.priority,
            ttl_ms=left_ms,
            budget=msgspec.structs.replace(record.task.budget, execute_ms=execute_ms),
            headers=child_headers(record.task) if child else {},
            created_at=run.started_ms,
            traceparent=tracecontext.child(record.task.traceparent, run.message_id),
        )

    async def _arm(self, record: WorkflowRecord, key: str, visit: int, due_ms: int) -> None:
        names = self._broker.names
        body = envelopes.encode(TimerDue(key=key, visit=visit, due_ms=due_ms))
        dedup = f"{record.instance_id}-{key}-{visit}-timer"
        await self._broker.publish(
            names.workflow_timer(record.instance_id), body, headers={h.MSG_ID: dedup}
        )

    async def _note(
        self,
        record: WorkflowRecord,
        event: str,
        key: str,
        detail: dict[str, object],
        *,
        once: bool = False,
    ) -> None:
        about = record.task
        if key:
            about = self._step_task(record, record.run_of(key))  # a replaced visit: a@1
        detail = {"workflow": record.workflow, **detail}
        if event in _ENDINGS:
            detail["duration_ms"] = record.ended_ms - record.started_ms
        subject, data, headers = event_message(self._broker, event_for(about, event, **detail))
        if once and await self._sent(subject):
            return
        await self._broker.publish(subject, data, headers=headers)

    async def _routed(self, record: WorkflowRecord, run: StepRun) -> bool:
        names = self._broker.names
        return await self._sent(
            names.events_of_message_of_kind("routed", record.trace_id, run.message_id)
        )

    async def _ending_said(self, record: WorkflowRecord) -> bool:
        ending = event_for(record.task, f"workflow_{record.status}")
        return await self._sent(event_message(self._broker, ending)[0])

    async def _sent(self, subject: str) -> bool:
        """Whether an event is stored on ``subject`` (each coordinator event has its own)."""
        stream = self._broker.names.events_stream
        try:
            return bool(await messages_on(self._broker, stream, subject, limit=1))
        except BrokerError as exc:  # sent again: a duplicate is better than a loss
            log.warning("could not look for an event", subject=subject, error=str(exc))
            return False

    async def _drop_timers(self, instance_id: str) -> None:
        """Remove an ended instance's timers (its deadline would otherwise wait for hours),
        one by one. Not a purge of their subject: nats-server then moved the consumer's ack
        floor past other instances' timers waiting on a delayed nak, which were never
        delivered again (a state's wait_s never fired; a restart within the 2-minute duplicate
        window could not arm it again)."""
        broker, names = self._broker, self._broker.names
        stream = names.workflows_stream
        try:
            for timer in await messages_on(broker, stream, names.workflow_timer(instance_id)):
                await delete_message(broker, stream, timer.stream_seq)
        except BrokerError as exc:
            log.warning("could not drop workflow timers", instance_id=instance_id, error=str(exc))

    async def _let_go(self, record: WorkflowRecord, key: str, run: StepRun) -> None:
        """A step's task the instance no longer waits for may wait for a person: withdraw it."""
        step = WorkflowStep(instance_id=record.instance_id, step=key)
        why = step_abandoned(record, step, run.message_id)
        await withdraw(self._broker, run.message_id, why or f"step {key!r} was let go")


def _undone_by(record: WorkflowRecord, run: StepRun) -> str | None:
    """The step ``run`` undoes, when it is a compensation."""
    for key, undo in record.compensations.items():
        if undo.message_id == run.message_id:
            return key
    return None
