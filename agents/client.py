"""``ReachClient``: publish tasks and invoke agents from any Python program."""

from __future__ import annotations

import asyncio
import functools
from types import TracebackType
from typing import Any, Self

import msgspec

from agentreach import envelopes
from agentreach.agents import workflow_control
from agentreach.agents.arguments import budget_of, task_of
from agentreach.agents.coordinator_presence import PublishWarnings
from agentreach.agents.errors import (
    InvalidArgument,
    NotAcknowledged,
    backlog_full,
    not_provisioned,
    not_stored,
    raise_if_lost,
)
from agentreach.agents.invocation import (
    Ending,
    OnAck,
    OnProgress,
    as_type,
    earlier_result,
    ended_result,
    unacknowledged,
    wait_for_result,
)
from agentreach.agents.workflow_control import SignalOutcome, WorkflowEnded
from agentreach.broker import (
    Auth,
    Broker,
    BrokerError,
    ClaimCheck,
    Names,
    NoStreamError,
    SubjectFull,
    listen,
)
from agentreach.broker.backpressure import publish_when_room
from agentreach.broker.claim_check import DEFAULT_THRESHOLD
from agentreach.broker.endings import OthersMessage
from agentreach.broker.failover import unanswered
from agentreach.broker.lifecycle import events_of_id
from agentreach.broker.names import COORDINATOR
from agentreach.broker.reply_box import ReplyBox
from agentreach.envelopes import (
    MAX_TTL_MS,
    Budget,
    Event,
    PayloadRef,
    Priority,
    Task,
    TraceReply,
    TraceRequest,
    new_id,
    now_ms,
)
from agentreach.envelopes import headers as h


class ReachClient:
    """A connection for sending work to agents.

    async with ReachClient(nats_url) as client:
        result = await client.invoke("summarize", {"text": "..."})
        message_id, trace_id = await client.publish("summarize", {"text": "..."})
    """

    def __init__(
        self,
        nats_url: str | None = None,
        *,
        broker: Broker | None = None,
        names: Names | None = None,
        name: str = "client",
        auth: Auth | None = None,
        claim_check_bytes: int = DEFAULT_THRESHOLD,
    ) -> None:
        if name == COORDINATOR:  # its tasks would be taken as the coordinator's own
            raise InvalidArgument(f"name={name!r}: the coordinator's sender token", argument="name")
        self._own_broker = broker is None
        self.broker = broker or Broker(nats_url, name=name, names=names, auth=auth)
        if self._own_broker:
            self.broker.opened_by = "ReachClient"
        self._name = name
        # Payloads and results above this size travel through the Object Store.
        self.claim_check = ClaimCheck(self.broker, claim_check_bytes)
        self._waiting: set[asyncio.Queue[envelopes.Reply | None]] = set()
        self._warnings = PublishWarnings(self.broker)

    @property
    def caller(self) -> str:
        """Who this client is: the name in its credentials, else the ``name`` given."""
        return self.broker.auth.identity or self._name

    async def __aenter__(self) -> Self:
        if self._own_broker:
            await self.broker.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._warnings.close()
        for replies in self._waiting:  # pending invokes end now, not at their deadlines
            replies.put_nowait(None)
        if self._own_broker:
            await self.broker.close()

    def task(
        self,
        topic: str,
        payload: Any,
        *,
        priority: Priority = "P1",
        ttl_ms: int | None = None,
        trace_id: str | None = None,
        message_id: str | None = None,
        reply_to: str | None = None,
        budget: Budget | None = None,
        headers: dict[str, str] | None = None,
        traceparent: str | None = None,
    ) -> Task:
        """Build a task envelope (validated as the coordinator will validate it).

        ``message_id`` defaults to a new id, ``trace_id`` to the message id and ``ttl_ms`` to
        30 s; ``headers`` are free key/values that routing rules can match (``header.<Name>``);
        ``traceparent`` (W3C) joins the task to the caller's OpenTelemetry trace (one that is
        not valid is ignored, as W3C asks). Raises :class:`InvalidArgument` naming a wrong
        argument, or a payload that has no JSON form."""
        message_id = new_id() if message_id is None else message_id
        fields: dict[str, Any] = {
            "v": 1,
            "kind": "task",
            "message_id": message_id,
            "trace_id": message_id if trace_id is None else trace_id,
            "topic": topic,
            "payload": payload,
            "priority": priority,
            "reply_to": reply_to,
            "created_at": now_ms(),
        }
        if ttl_ms is not None:
            fields["ttl_ms"] = ttl_ms
        if budget is not None:
            fields["budget"] = budget
        if headers is not None:
            fields["headers"] = headers
        if traceparent:
            fields["traceparent"] = envelopes.tracecontext.normalized(traceparent)
        return task_of(fields)

    async def submit(self, task: Task, *, elections_s: float | None = None) -> bool:
        """Publish a built task to ``reach.task.<topic>.<caller>``, as :attr:`caller` (a large
        payload is claim-checked).

        While the intake holds as many of this caller's tasks on the topic as it keeps, it
        waits for room (backpressure), up to the task's ttl. While JetStream does not answer
        (a restart, an election, a lost majority), it is sent again under its id for up to
        ``elections_s`` (default ``election_budget_s``), then NotStored. False when the
        stream held its id already (the duplicate window): the earlier message's outcome is
        the answer."""
        task = await self.claim_check.stow_task(task)
        subject = self.broker.names.task(task.topic, self.caller)
        data, headers = envelopes.encode(task), h.task_headers(task)
        try:
            stored = await publish_when_room(
                self.broker,
                subject,
                data,
                headers=headers,
                within_s=task.ttl_ms / 1000,
                elections_s=elections_s,
            )
        except NoStreamError as exc:
            raise not_provisioned(task, subject) from exc
        except SubjectFull as exc:
            raise backlog_full(task, self.caller, exc) from exc
        except BrokerError as exc:
            if unanswered(exc):
                raise not_stored(task, exc) from exc
            raise_if_lost(self.broker, exc)
            raise
        return not stored.duplicate

    async def publish(
        self,
        topic: str,
        payload: Any,
        *,
        priority: Priority = "P1",
        ttl_ms: int | None = None,
        trace_id: str | None = None,
        message_id: str | None = None,
        reply_to: str | None = None,
        budget: Budget | None = None,
        headers: dict[str, str] | None = None,
        traceparent: str | None = None,
    ) -> tuple[str, str]:
        """Fire and forget; returns ``(message_id, trace_id)``. The options are
        :meth:`task`'s.

        The task is stored in the task stream before this returns. When no coordinator runs,
        it waits there until one starts (within its ttl), and a warning is logged: the check
        runs in the background, at most once a minute, and never delays the publish.
        While the intake holds as many of this caller's tasks on the topic as it keeps, it
        waits for room (backpressure). Raises :class:`NotProvisioned` when the server has no
        task stream, and :class:`BacklogFull` when no room came within the task's ttl."""
        task = self.task(
            topic,
            payload,
            priority=priority,
            ttl_ms=ttl_ms,
            trace_id=trace_id,
            message_id=message_id,
            reply_to=reply_to,
            budget=budget,
            headers=headers,
            traceparent=traceparent,
        )
        taken = await self.submit(task)
        self._warnings.published(topic, task.message_id, taken=taken)
        return task.message_id, task.trace_id

    async def invoke(
        self,
        topic: str,
        payload: Any,
        *,
        priority: Priority = "P1",
        ack_deadline_ms: int = 2_000,
        execute_deadline_ms: int = 30_000,
        trace_id: str | None = None,
        message_id: str | None = None,
        ttl_ms: int | None = None,
        headers: dict[str, str] | None = None,
        traceparent: str | None = None,
        on_ack: OnAck | None = None,
        on_progress: OnProgress | None = None,
        result_type: Any = None,
    ) -> Any:
        """Send a task and wait for its result (converted to ``result_type`` when given:
        a Struct, a dataclass, ``list[X]`` … as ``msgspec.convert`` takes them).

        Raises :class:`InvalidArgument` before sending when an argument is wrong;
        :class:`NotProvisioned` when the server has no task stream, :class:`BacklogFull` when
        the intake held too many of this caller's tasks on the topic for the task's whole
        ttl (nothing was sent; until then the call waits for room);
        :class:`NotAcknowledged` if no agent accepts the task within ``ack_deadline_ms``
        (saying so when no coordinator runs); :class:`DeadlineExceeded` if, once accepted,
        no outcome comes within ``execute_deadline_ms`` nor before the task's ttl runs out
        (and the coordinator's verdict of it); :class:`Rejected` when the task
        is refused before any agent took it (nothing ran: safe to send again); and
        :class:`TaskFailed` when it fails after an agent took it (the handler's error, or
        a retry refused after an attempt ran).

        After NotAcknowledged or DeadlineExceeded the task is still queued or running and
        may still complete, until its ttl runs out. To retry safely, invoke again with the
        same ``message_id`` (the error's ``message_id``): the new call attaches to the first
        message and answers with how it ends, and the task runs once. A new id sends a
        second task; never do that for a task that is not idempotent.

        ``execute_deadline_ms`` is also the handler's budget (each workflow step's too).
        ``ttl_ms`` bounds when the task may start (a workflow: the whole instance), and the
        call waits at least that long; it defaults to both deadlines together (at most a
        day).
        ``headers`` and ``traceparent`` are :meth:`task`'s. A result too large to travel
        inline is fetched from the Object Store.
        """
        budget = budget_of(ack_deadline_ms=ack_deadline_ms, execute_deadline_ms=execute_deadline_ms)
        task = self.task(
            topic,
            payload,
            priority=priority,
            trace_id=trace_id,
            message_id=message_id,
            ttl_ms=min(budget.ack_ms + budget.execute_ms, MAX_TTL_MS) if ttl_ms is None else ttl_ms,
            budget=budget,
            headers=headers,
            traceparent=traceparent,
        )
        return await self.invoke_task(
            task, on_ack=on_ack, on_progress=on_progress, result_type=result_type
        )

    async def invoke_task(
        self,
        task: Task,
        *,
        on_ack: OnAck | None = None,
        on_progress: OnProgress | None = None,
        result_type: Any = None,
    ) -> Any:
        """:meth:`invoke` of a built task (:meth:`task`, or ``TaskContext.child_task``): its
        deadlines are its budget's ``ack_ms`` and ``execute_ms``, its replies come to a reply
        box of this call's (its ``reply_to`` is replaced)."""
        box = ReplyBox(self.broker.names, self.caller, new_id())
        replies = box.replies
        task = msgspec.structs.replace(task, reply_to=box.subject)
        # Made before the box is subscribed: a reconnect from then on may lose a reply.
        ending = Ending(self.broker, functools.partial(self._own_status, task.message_id))
        self._waiting.add(replies)
        try:
            async with await listen(self.broker, box.wildcard, box.collect):
                # A caller that gives an agent longer to accept it gives JetStream as long to
                # store it (a trial's lost majority: NotStored at 15 s of an ack deadline of 40).
                elections_s = max(self.broker.election_budget_s, task.budget.ack_ms / 1000)
                if await self.submit(task, elections_s=elections_s):
                    try:
                        result = await wait_for_result(task, replies, on_ack, on_progress, ending)
                    except NotAcknowledged as exc:
                        raise await unacknowledged(exc, task, ending, self.broker) from None
                else:  # sent before: nobody answers this box, the earlier message's end does
                    result = await self._earlier_result(task)
                return as_type(await self.claim_check.result_of(*result), result_type, task)
        except BrokerError as exc:
            raise_if_lost(self.broker, exc)
            raise
        finally:
            self._waiting.discard(replies)

    async def _earlier_result(self, task: Task) -> tuple[Any, PayloadRef | None]:
        """The outcome of the message already taken in under ``task``'s id, once it ends."""
        read = functools.partial(self._own_status, task.message_id)
        return await earlier_result(task, read, self.caller, self.broker)

    async def cancel_workflow(
        self, instance_id: str, *, why: str = "", wait_s: float = 10.0
    ) -> WorkflowEnded:
        """Cancel a workflow instance this caller started (its id: the starting task's
        ``message_id``) and wait up to ``wait_s`` for it to end: ``status`` ``cancelled``,
        or how it ended otherwise first. ``why`` becomes its error's message. Raises
        :class:`UnknownWorkflow` for an id that is no instance of this caller's,
        :class:`DeadlineExceeded` when it has not ended within ``wait_s`` (it was sent), and
        :class:`WorkflowActionRefused` when not acted on (the caller was over its quota)."""
        return await workflow_control.cancel_workflow(
            self.broker, self.caller, self.status, instance_id, why=why, wait_s=wait_s
        )

    async def signal_workflow(
        self, instance_id: str, event: str, *, wait_s: float = 10.0
    ) -> SignalOutcome:
        """Signal ``event`` to a state machine instance this caller started and wait up to
        ``wait_s`` for whether its state took it (:class:`SignalOutcome`). Raises
        :class:`UnknownWorkflow` for an id that is no instance of this caller's,
        :class:`DeadlineExceeded` when the coordinator has not said within ``wait_s``, and
        :class:`WorkflowActionRefused` when not acted on (the caller was over its quota)."""
        return await workflow_control.signal_workflow(
            self.broker, self.caller, self.status, instance_id, event, wait_s=wait_s
        )

    async def result(
        self, message_id: str, *, timeout_s: float = 30.0, result_type: Any = None
    ) -> Any:
        """The result of a message this caller sent earlier (:meth:`publish`, or an invoke
        that gave up), once it ends, waiting up to ``timeout_s``: Celery's
        ``AsyncResult(id).get()``. Nothing is sent: it reads the message's events. Raises
        as :meth:`invoke` does for how it ended (``TaskFailed``, ``Rejected``, …);
        ``DeadlineExceeded`` when it has not ended within ``timeout_s`` (it may still: ask
        again) or no event of it is recorded; ``InvalidArgument`` for another caller's
        message; ``NotAcknowledged`` when it has not ended and no coordinator runs."""
        ids = {"message_id": message_id, "trace_id": message_id}
        read = functools.partial(self._own_status, message_id)
        ended = await ended_result(ids, read, self.caller, self.broker, within_s=timeout_s)
        stub = Task(v=1, message_id=message_id, trace_id=message_id, topic="the message")
        return as_type(await self.claim_check.result_of(*ended), result_type, stub)

    async def status(self, message_id: str, *, timeout_s: float = 5.0) -> list[Event]:
        """The recorded lifecycle events of ``message_id`` (or, when no message has that id,
        of the trace that has it), oldest first.

        With credentials (a secured deployment) the coordinator answers, and only about this
        caller's own messages; on an open server the client reads the event stream itself."""
        if self.broker.auth.identity is None:
            return await events_of_id(self.broker, message_id)
        return (await self._traced(message_id, timeout_s)).events

    async def _own_status(self, message_id: str) -> list[Event]:
        """:meth:`status`; raises OthersMessage when the id is another caller's message."""
        if self.broker.auth.identity is None:
            return await events_of_id(self.broker, message_id)
        traced = await self._traced(message_id, 5.0)
        if traced.others:
            raise OthersMessage(f"message id {message_id!r} is another caller's message")
        return traced.events

    async def _traced(self, message_id: str, timeout_s: float) -> TraceReply:
        request = envelopes.encode(TraceRequest(message_id=message_id))
        subject = self.broker.names.trace_request(self.caller)
        answer = await self.broker.request(subject, request, timeout=timeout_s)
        return envelopes.decode_as(answer.data, TraceReply)
