"""Calls: core request/reply whose answer is the task's result.

``nats req reach.call.summarize '{"text": "..."}'`` gets the result of the task, not a
storage receipt: a coordinator replica (one of the queue group) publishes the body to
``reach.task.<topic>`` (``reach.call.<topic>.<sender>`` to ``reach.task.<topic>.<sender>``,
so the caller is named as on intake) with a reply box of its own for this call
(``reach.reply.<sender>.<box>``, ``reach.reply.coordinator.<box>`` for the bare form: a box,
because agents may answer only there on a secured server), lets acks and progress pass,
and answers the requester once, with the result (its JSON) or with ``{"error": {...}}``
and the header ``Reach-Kind: error``. Headers of the request (``Nats-Msg-Id``,
``Reach-Trace-Id``, ``Reach-Priority``, ``Reach-TTL``, ``traceparent``) count as for
``nats pub``. Nobody answers when no coordinator runs: the requester hears so at once.
The wait lives in the replica that took the call; if it dies, the requester times out
while the task itself still completes (it is durable in ``REACH_TASKS``). A call whose task
id the stream holds already (sent again within the duplicate window) is not taken in again:
it is answered with how the earlier message ends, read from its events.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError, ClaimCheck, Inbound, Subscription, TooLarge
from agentreach.broker.endings import Ended, OthersMessage, Sent, wait_for_ending
from agentreach.broker.errors import pause
from agentreach.broker.lifecycle import events_of_id, own_events
from agentreach.broker.reply_box import ReplyBox
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator.call_bodies import addressed
from agentreach.envelopes import (
    DEFAULT_TTL_MS,
    MAX_TTL_MS,
    Ack,
    ErrorInfo,
    ErrorReply,
    Event,
    PayloadRef,
    Reply,
    Result,
    new_id,
)
from agentreach.envelopes import headers as h

log = structlog.get_logger("coordinator.calls")

BARE_CALLER = "coordinator"  # whose box the bare form's replies go to (no caller may be named so)
GRACE_S = 1.0  # past the task's ttl, the coordinator's own verdict has had time to arrive
RECHECK_S = 1.0  # after a reconnect, how often a waiting call reads its task's events
EARLIER_LOOK_S = 60.0  # how long one read of an earlier message's events waits before a recount

# An earlier message a call sent again waits for: its caller, its id, and what was sent.
_Earlier = tuple[str | None, str, Sent]


@dataclass(frozen=True, slots=True)
class _Requester:
    """Where a call's answer goes, and the id of its task (said in ``Reach-Message-Id``, so
    a requester that gave up can look the task up)."""

    subject: str
    message_id: str


@dataclass(slots=True)
class _Waiting:
    """A call waiting for its task's result."""

    requester: _Requester  # where the answer goes
    timer: asyncio.TimerHandle  # the give-up after the task's ttl (its execution, once accepted)
    box: ReplyBox  # keeps only the replies of the agent the coordinator announced
    replies: Subscription  # the call's reply box
    execute_ms: int  # the task's execute budget: how long a run may take once accepted
    asked: _Earlier  # its caller, its task's id and what was sent: its events tell its end
    reconnects: int  # the connection's reconnects when it began: a reply may be lost since
    # Who acknowledged the task: an agent's id, or "" for the coordinator (a workflow started,
    # or it waits for a person in manual review); None: nobody yet.
    accepted_by: str | None = None


class Calls:
    """Answers ``reach.call.<topic>`` requests with the task's result."""

    def __init__(self, broker: Broker, claim_check: ClaimCheck) -> None:
        self._broker = broker
        self._claim_check = claim_check
        self._waiting: dict[str, _Waiting] = {}
        self._earlier: dict[_Earlier, list[str]] = {}  # → the keys of the calls waiting for it
        self._answering: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Begin; the calls come to :meth:`on_call` (the coordinator's calls desk)."""
        self._in_background(self._recheck_after_reconnects())

    async def on_call(self, msg: Inbound) -> None:
        if not msg.reply:
            return  # a publish, not a request: nobody to answer (use reach.task.<topic>)
        if not msg.answerable:
            return  # its answer would be the coordinator's write to a subject of its choice
        names = self._broker.names
        topic, sender = names.call_subject_parts(msg.subject)
        headers = {k: v for k, v in msg.headers.items() if k != h.REPLY_TO}
        # A box nobody can guess (an agent may answer in any box of the caller's), whose
        # replies count only from the agent the coordinator announces (ReplyBox).
        box = ReplyBox(names, sender or BARE_CALLER, f"call{secrets.token_hex(16)}")
        key = box.subject
        call = addressed(msg.data, key)
        refused = call.message_id and h.msg_id_differs(headers, call.message_id)
        if sender is not None and refused:
            # Not taken in (intake refuses it): its sends again under the header's id were
            # each a duplicate that waited a whole ttl for an end that never came.
            error = ErrorInfo(type="invalid_envelope", message=refused, retryable=False)
            # Said under the body's id: the one the caller would look the task up by.
            requester = _Requester(msg.reply, call.message_id)
            await self._answer(requester, _failure(error, "invalid_envelope"), error=True)
            return
        # Each reply arrives on <box>.<agent>; subscribed before the task is published.
        replies = await self._broker.subscribe(box.wildcard, self._on_reply)
        data, execute_ms = call.data, call.execute_ms
        headers[h.REPLY_TO] = key
        # An envelope is known by its own id (intake refuses a differing header).
        headers.setdefault(h.MSG_ID, call.message_id or new_id())
        ttl = headers.get(h.TTL, "")
        header_ttl = int(ttl) if ttl.isdigit() and 0 < int(ttl) <= MAX_TTL_MS else None
        ttl_ms = call.ttl_ms or header_ttl or DEFAULT_TTL_MS  # an envelope's own wins
        timer = asyncio.get_running_loop().call_later(
            ttl_ms / 1000 + GRACE_S, self._give_up, key, ttl_ms
        )
        requester = _Requester(msg.reply, call.message_id or headers[h.MSG_ID])
        asked = (sender, requester.message_id, Sent(topic, call.sha256))
        reconnects = self._broker.reconnects
        self._waiting[key] = _Waiting(requester, timer, box, replies, execute_ms, asked, reconnects)
        try:
            subject = self._broker.names.task(topic, sender)  # the caller stays the sender
            # The caller's id as the caller would publish it: sealed, it would not be the
            # body's (intake refuses that), nor the id the caller looks its task up by.
            stored = await self._broker.publish(subject, data, headers=headers, seal_id=False)
        except BrokerError as exc:
            self._forget(key)
            error = ErrorInfo(type="not_published", message=str(exc), retryable=True)
            await self._answer(requester, {"error": error}, error=True)
            return
        if stored.duplicate:  # sent before: nobody answers this box, the earlier end does
            self._in_background(replies.close())
            waiting_for_it = self._earlier.setdefault(asked, [])
            waiting_for_it.append(key)
            if len(waiting_for_it) == 1:  # one read of its events for all its calls
                self._in_background(self._answer_earlier(asked))

    async def stop(self) -> None:
        """Stop the answers still being worked on (their callers time out)."""
        await cancel_and_wait(*self._answering)

    async def _answer_earlier(self, earlier: _Earlier) -> None:
        """Answer every call waiting for how the message already taken in under this id ends
        (unless it is another caller's, or another request: then, that the id is taken);
        each call's give-up timer answers it when the message does not end within its ttl."""
        caller, message_id, sent = earlier
        read = functools.partial(self._events_of, message_id, caller)
        ended: Ended | None = None
        try:
            while ended is None and self._still_waiting(earlier):
                ended = await wait_for_ending(
                    read, within_s=EARLIER_LOOK_S, caller=caller, sent=sent
                )
        except OthersMessage as exc:
            taken = f"{exc}: send it under an id of your own"
            error = ErrorInfo(type="duplicate_id", message=taken, retryable=False)
            ended = Ended(error=error, reason="duplicate_id")
        except BrokerError as exc:
            log.warning("could not read how an earlier call ended", error=str(exc))
        keys = self._earlier.pop(earlier, [])
        if ended is None:
            return  # each call's give-up timer answers it
        for requester in [self._forget(key) for key in keys if key in self._waiting]:
            if ended.error is not None:
                await self._answer(requester, _failure(ended.error, ended.reason), error=True)
            else:
                await self._answer_result(requester, ended.result, ended.result_ref)

    def _still_waiting(self, earlier: _Earlier) -> bool:
        """Whether a call still waits for how ``earlier`` ends (the others gave up)."""
        keys = self._earlier.get(earlier, [])
        keys[:] = [key for key in keys if key in self._waiting]
        return bool(keys)

    async def _events_of(self, message_id: str, caller: str | None) -> list[Event]:
        """The events of ``caller``'s own runs of ``message_id``: judged against another
        caller's run (same id, sent past the duplicate window), a resend was refused as
        "another payload", naming a digest of that caller's payload."""
        if caller is None:
            return await events_of_id(self._broker, message_id)
        names = self._broker.names
        own, others = await own_events(self._broker, caller, names.events_of_message(message_id))
        if not own and others:
            raise OthersMessage(f"message id {message_id!r} is another caller's message")
        return own

    async def _on_reply(self, msg: Inbound) -> None:
        waiting = self._waiting.get(msg.subject.rpartition(".")[0])
        if waiting is None:
            return
        waiting.box.collect(msg)
        while not waiting.box.replies.empty() and waiting.box.subject in self._waiting:
            reply = waiting.box.replies.get_nowait()
            if reply is not None:
                await self._settle(waiting.box.subject, reply)

    async def _settle(self, key: str, reply: Reply) -> None:
        # The answers leave from tasks of their own: forgetting the call closes its reply
        # box, and with it this callback (a claim-checked result is fetched first).
        match reply:
            case Result():
                requester = self._forget(key)
                self._in_background(self._answer_result(requester, reply.result, reply.result_ref))
            case ErrorReply():
                requester = self._forget(key)
                answer = _failure(reply.error, reply.reason)
                self._in_background(self._answer(requester, answer, error=True))
            case Ack():
                self._running(key, reply.from_agent or "")
            case _:
                return  # progress: the requester waits for the end

    async def _answer_result(
        self, requester: _Requester, result: Any, ref: PayloadRef | None
    ) -> None:
        try:
            result = await self._claim_check.result_of(result, ref)
        except BrokerError as exc:
            error = ErrorInfo(type="payload_unavailable", message=str(exc), retryable=False)
            await self._answer(requester, {"error": error}, error=True)
            return
        await self._answer(requester, result)

    def _forget(self, key: str) -> _Requester:
        waiting = self._waiting.pop(key)
        waiting.timer.cancel()
        self._in_background(waiting.replies.close())
        return waiting.requester

    def _running(self, key: str, by: str) -> None:
        """An agent accepted the task (or a workflow started): the wait lasts its execute
        budget from now, when that ends after the ttl (how long it may wait to start)."""
        waiting = self._waiting[key]
        waiting.accepted_by = by
        loop = asyncio.get_running_loop()
        budget_ends = loop.time() + waiting.execute_ms / 1000 + GRACE_S
        if budget_ends <= waiting.timer.when():
            return
        waiting.timer.cancel()
        waiting.timer = loop.call_at(budget_ends, self._give_up, key, 0)

    async def _recheck_after_reconnects(self) -> None:
        """Replies are core messages: one sent while this connection was away (a server
        restart) is gone, and the call said "no result" of a task that had completed. After
        a reconnect each call begun before reads its task's events once a second."""
        while True:
            await pause(RECHECK_S)
            for key, waiting in list(self._waiting.items()):
                if waiting.reconnects != self._broker.reconnects:
                    await self._answered_from_events(key)

    async def _answered_from_events(self, key: str) -> bool:
        """Answer the call ``key`` from its task's events if they end it; whether they did."""
        if (waiting := self._waiting.get(key)) is None:
            return True
        caller, message_id, sent = waiting.asked
        read = functools.partial(self._events_of, message_id, caller)
        try:
            ended = await wait_for_ending(read, within_s=0, caller=caller, sent=sent)
        except (BrokerError, OthersMessage):
            ended = None  # its replies, or its give-up, answer it
        if key not in self._waiting:
            return True  # answered meanwhile
        if ended is None:
            return False
        requester = self._forget(key)
        if ended.error is not None:
            await self._answer(requester, _failure(ended.error, ended.reason), error=True)
        else:
            await self._answer_result(requester, ended.result, ended.result_ref)
        return True

    def _give_up(self, key: str, ttl_ms: int) -> None:
        """No answer in time: within the ttl (``ttl_ms``), or, once accepted (0), within the
        execute budget. Its task's events are read first: a reply may have been lost."""
        if key in self._waiting:
            self._in_background(self._given_up(key, ttl_ms))

    async def _given_up(self, key: str, ttl_ms: int) -> None:
        if (waiting := self._waiting.get(key)) is None:
            return  # answered since the timer fired
        timer = waiting.timer
        if await self._answered_from_events(key) or self._waiting[key].timer is not timer:
            return  # answered, or accepted meanwhile: a new deadline
        requester = self._forget(key)
        accepted = _accepted(waiting.accepted_by)
        if not ttl_ms:
            within = f"its execute budget ({waiting.execute_ms} ms) after {accepted}"
        elif waiting.accepted_by is not None:  # the budget ended first: a retry could end it
            within = f"the task's ttl ({ttl_ms} ms), though {accepted}"
        else:
            within = f"the task's ttl ({ttl_ms} ms); no agent accepted it"
        error = ErrorInfo(type="no_result", message=f"no result within {within}", retryable=False)
        await self._answer(requester, {"error": error}, error=True)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, requester: _Requester, value: object, *, error: bool = False) -> None:
        headers = {h.KIND: "error" if error else "result", h.MESSAGE_ID: requester.message_id}
        data = envelopes.encode(value)
        try:
            await self._broker.publish_core(requester.subject, data, headers=headers)
        except TooLarge as exc:
            if error:
                log.warning("could not answer a call", error=str(exc))
                return
            # Told, not left to its timeout: sent again under a new id, the work would run twice.
            why = answer_too_large(requester.message_id, len(data), self._broker.max_payload)
            await self._answer(requester, {"error": why}, error=True)
        except BrokerError as exc:
            log.warning("could not answer a call", error=str(exc))


def answer_too_large(message_id: str, size: int, max_payload: int) -> ErrorInfo:
    """The gateway's error for a result that completed but is larger than one message."""
    message = (
        f"the task completed, but its result ({size} bytes of JSON) is larger than a message"
        f" of this server ({max_payload} bytes): read it by its id, {message_id!r}"
        " (`reach publish --wait --message-id`, `ReachClient.result`), not by reach.call"
    )
    return ErrorInfo(type="answer_too_large", message=message, retryable=False)


def _accepted(by: str | None) -> str:
    if by:
        return f"agent {by} accepted it"
    return (
        "the coordinator acknowledged it: a workflow started, or it waits for a person in"
        " manual review (its trace tells which, and how it ends)"
    )


def _failure(error: ErrorInfo, reason: str | None) -> dict[str, object]:
    """A call's error answer: the error, and how the message ended (its dead-letter reason,
    ``refused``, ``duplicate_id`` …) when the coordinator said so; the gateway's own errors
    (``not_published``, ``no_result``, ``payload_unavailable``) end no message and say none."""
    return {"error": error} if reason is None else {"error": error, "reason": reason}
