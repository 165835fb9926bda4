"""From a message on ``reach.task.<topic>[.<sender>]`` to a dispatched task, a dead letter,
or a refusal of a caller over its quota."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec
import structlog

from agentreach.broker import Broker, BrokerError, ClaimCheck, Delivery, TooLarge
from agentreach.broker.dead_letters import RAW_KEPT, dead_letter
from agentreach.broker.lifecycle import reply
from agentreach.broker.names import COORDINATOR
from agentreach.coordinator.delivery.dead_letters import end_with_error, error_reply
from agentreach.coordinator.protection.quotas import CallerQuotas
from agentreach.coordinator.protection.rate_limits import UnheardRefusals
from agentreach.coordinator.protection.server_answers import ServerAnswers
from agentreach.coordinator.routing.priorities import PriorityAllowances
from agentreach.coordinator.routing.router import Router
from agentreach.coordinator.workflows.engine import WorkflowEngine
from agentreach.envelopes import (
    INVALID_TOPIC,
    AgentCard,
    DecodeError,
    ErrorInfo,
    ServerAnswer,
    Task,
    decode_json,
    is_reply_subject,
    is_token,
    refuse_server_answers,
    stable_id,
    task_from_intake,
    ttl_left_ms,
)
from agentreach.envelopes import headers as h
from agentreach.envelopes.intake import ReplyPolicy

log = structlog.get_logger("coordinator.intake")

# Deliveries a large body's claim check is tried on before its task is dead-lettered: a
# failure that outlasts three (a refusal the server reports only as a timeout, a store
# that is full) will not heal while the caller waits.
STOW_TRIES = 3
# A task for a workflow this replica does not serve and another replica does (their
# configurations differ for a while: a rolling restart) comes back this often, this many
# times, for that replica to take it, before it is routed here (as a topic nobody serves).
ELSEWHERE_S = 0.25
ELSEWHERE_LOOKS = 40


class _Origin(NamedTuple):
    """Who sent a task, as its subject says."""

    topic: str
    sender: str | None  # None: the bare form, or a coordinator's (not a new call)
    resent: bool  # sent again by a coordinator: it keeps its caller and its fields


class Intake:
    """Validates or wraps each intake message, then hands it to the router."""

    def __init__(
        self,
        broker: Broker,
        router: Router,
        workflows: WorkflowEngine,
        quotas: CallerQuotas | None = None,
        *,
        on_taken: Callable[[str, str, int], None] | None = None,
        claim_check: ClaimCheck | None = None,
        priorities: PriorityAllowances | None = None,
        elsewhere: Callable[[str], bool] | None = None,
    ) -> None:
        self._broker = broker
        self._elsewhere = elsewhere or (lambda topic: False)  # a workflow of another replica
        self._router = router
        self._workflows = workflows
        self._quotas = quotas
        self._on_taken = on_taken  # (topic, priority, stored_ms) of each task taken in once
        self._claim_check = claim_check or ClaimCheck(broker)
        self._priorities = priorities or PriorityAllowances()  # none enforced unless given
        self._shadowing: set[str] = set()  # workflows said to take an intent agents serve
        self._unheard = UnheardRefusals("its quota")
        self._server_answers = ServerAnswers()

    async def handle(self, msg: Delivery) -> float | None:
        """Decide the message's fate: None to acknowledge it, or seconds until it comes back."""
        origin = self._origin_of(msg.subject)
        topic, sender = origin.topic, origin.sender
        try:
            task = self._taken_in(msg, origin)
        except DecodeError as exc:
            fallback_id = stable_id(msg.timestamp_ns, msg.stream, msg.stream_seq)
            if isinstance(exc, ServerAnswer):  # the subject's caller did not send it
                if (said := self._server_answers.to_letter(exc, "intake")) is None:
                    return None
                exc, sender = said, None
            stub = self._stub(msg, topic, fallback_id, sender)
            if isinstance(exc, ServerAnswer):  # nobody's: the reply_to it names is nobody's
                stub = msgspec.structs.replace(stub, reply_to=None)
            # Charged as a task would be: a caller over its quota must not flood the DLQ.
            if (
                sender is not None
                and msg.num_delivered == 1
                and not await self._within_quota(stub, decoded=False)
            ):
                return None
            await self._invalid(msg, stub, exc)
            return None
        # A reassignment comes back through intake as attempt + 1: not a task taken in.
        if self._on_taken is not None and msg.num_delivered == 1 and task.attempt == 1:
            self._on_taken(task.topic, task.priority, msg.timestamp_ms)
        with structlog.contextvars.bound_contextvars(
            message_id=task.message_id, trace_id=task.trace_id, topic=task.topic
        ):
            # The ttl runs from the broker's receipt, on this coordinator's clock.
            left_ms = ttl_left_ms(task.ttl_ms, msg.timestamp_ms)
            seen_before = msg.num_delivered > 1
            # Only the caller the subject names is charged (permissions make it the real
            # one), once: a republish on the bare form (a reassignment) is not a new call.
            if sender is not None and not seen_before and not await self._within_quota(task):
                return None
            # After the quota: a sender writes these dead letters no faster than its quota.
            if sender is not None and not await self._priorities.admit(self._broker, task):
                return None
            if len(msg.data) > self._claim_check.threshold_bytes:  # a large `nats pub` body
                try:
                    task = await self._claim_check.stow_task(task)
                except BrokerError as exc:
                    return await self._not_stowed(task, exc, msg.num_delivered, left_ms)
            if not self._workflows.serves(task.topic) and not await self._workflows.started(task):
                if self._elsewhere(task.topic) and msg.num_delivered < ELSEWHERE_LOOKS:
                    if msg.num_delivered == 1:
                        log.info("a workflow another replica serves, not this one: left to it")
                    return ELSEWHERE_S
                return await self._router.dispatch(
                    task,
                    left_ms=left_ms,
                    waited=msg.num_delivered - 1,
                    origin=f"t{msg.stream_seq}",
                )
            if left_ms <= 0 and not seen_before:  # seen before: it may have started already
                await self._router.end(task, "expired", f"ttl {task.ttl_ms} ms passed in intake")
                return None
            self._say_if_shadowing(task.topic)
            await self._workflows.start(task, seen_before=seen_before)
            return None

    def card_seen(self, card: AgentCard) -> None:
        """An agent's card that lists an intent named like a workflow: said when the card is
        written (or found at the start), not only at the first task of that name."""
        for intent in card.intents:
            if self._workflows.serves(intent):
                self._say_if_shadowing(intent)

    def _say_if_shadowing(self, workflow: str) -> None:
        """Once per workflow: agents serving an intent of its name never get its tasks."""
        if workflow in self._shadowing:
            return
        if agents := sorted(c.agent_id for c in self._router.fleet.directory.serving(workflow)):
            self._shadowing.add(workflow)
            log.warning(
                "a workflow takes every task of its name: agents that serve an intent of that"
                " name get none (rename the workflow or the intent)",
                workflow=workflow,
                agents=agents[:5],
                agents_total=len(agents),
            )

    async def _not_stowed(
        self, task: Task, exc: BrokerError, delivered: int, left_ms: int
    ) -> float | None:
        """After a failed claim check: seconds until the message comes back, or None once
        the task is dead-lettered (too large to carry, tried ``STOW_TRIES`` times, or out
        of ttl), with the reason in the letter and in the error its caller gets."""
        if isinstance(exc, TooLarge) or delivered >= STOW_TRIES or left_ms <= 0:
            message = f"its payload could not be claim-checked: {exc}"
            if not isinstance(exc, TooLarge):
                message += f" ({delivered} tries; is the Object Store there and writable?)"
            log.error("claim check failed; dead-lettered", error=str(exc), tries=delivered)
            error = ErrorInfo(type="claim_check_failed", message=message, retryable=False)
            await end_with_error(self._broker, task, "rejected", error, started=False)
            return None
        log.warning("claim check failed; will try again", error=str(exc), tries=delivered)
        return float(2 ** (delivered - 1))

    def task_of(self, msg: Delivery) -> Task | None:
        """The task ``msg`` holds, as :meth:`handle` takes it in (its sender's claims checked
        against its subject), or None when it holds none."""
        try:
            return self._taken_in(msg, self._origin_of(msg.subject))
        except DecodeError:
            return None

    def _origin_of(self, subject: str) -> _Origin:
        """What the subject says of who sent the task. No other party may publish as
        ``_coordinator`` (permissions, and a party's name cannot start with ``_``)."""
        topic, sender = self._broker.names.task_subject_parts(subject)
        resent = sender == COORDINATOR
        return _Origin(topic, None if resent else sender, resent)

    def _taken_in(self, msg: Delivery, origin: _Origin) -> Task:
        sender = origin.sender
        headed = self._headers_required(origin)
        refuse_server_answers(msg.data, msg.headers, msg.subject, headed=headed)
        task = task_from_intake(
            msg.data,
            msg.headers,
            topic=origin.topic,
            received_ms=msg.timestamp_ms,
            fallback_id=stable_id(msg.timestamp_ns, msg.stream, msg.stream_seq),
            reply_allowed=self._reply_policy(sender),
        )
        if origin.resent:
            return task  # sent again by a coordinator: its fields stand
        # Only the coordinator stamps the intake time (a sender's own would move the task's
        # ttl, its workflow's deadline and its trace: an outside trial set it 10 min back)
        # and counts attempts (a sender's would spend its task's retries, or buy it more).
        task = msgspec.structs.replace(task, received_ms=msg.timestamp_ms, attempt=1, requeued=0)
        if sender is None:  # the bare form, an operator's: a full envelope's id is its own
            return task
        if why := h.msg_id_differs(msg.headers, task.message_id):
            raise DecodeError(why)
        # The subject names the sender; the body's own claims give way.
        from_agent = sender if task.from_agent is not None else None
        return msgspec.structs.replace(task, caller=sender, from_agent=from_agent)

    async def _within_quota(self, task: Task, *, decoded: bool = True) -> bool:
        """Take a token of the caller's quota; False when the task was refused for it: an
        error to the caller and a ``rejected`` event, and a dead letter when nobody would
        hear of it otherwise (see :class:`UnheardRefusals`)."""
        if self._quotas is None or task.caller is None:
            return True
        over = await self._quotas.admit(task.caller)
        if over is None:
            return True
        limit = over.limit
        await self._router.over_rate(
            task,
            over.why(),
            over.retry_after_ms,
            letter=decoded and self._unheard.letter(task, limit),
            caller=over.caller,
            quota={"name": over.quota, "rate": limit.rate, "burst": limit.burst},
        )
        return False

    def _headers_required(self, origin: _Origin) -> bool:
        """Whether a task from ``origin`` must carry headers: the coordinator's own always do;
        on a secured deployment every task must (``nats pub -H Nats-Msg-Id:…``), or any
        agent could have the server store one in any caller's name (see NO_HEADERS)."""
        return origin.resent or self._broker.dedup_secret is not None

    def _reply_policy(self, sender: str | None) -> ReplyPolicy:
        """Where replies may go: a sender's own reply box only (``reach.reply.<sender>.…``);
        for the bare operators' form, anywhere outside our own subjects."""
        names = self._broker.names
        if sender is None:
            return names.reply_allowed
        return lambda subject: names.caller_of_reply_box(subject) == sender

    def _stub(self, msg: Delivery, topic: str, fallback_id: str, sender: str | None) -> Task:
        """What an undecodable message claims to be (its ids, and a reply box its sender may
        be answered in), to dead-letter or refuse it by."""
        headers = msg.headers or {}
        claimed = _claimed_ids(msg.data)
        message_id = _token_or(headers.get(h.MSG_ID) or claimed.get("message_id"), fallback_id)
        trace_id = _token_or(headers.get(h.TRACE_ID) or claimed.get("trace_id"), message_id)
        policy = self._reply_policy(sender)
        # The header, or else the body's own field: the error goes where the sender listens.
        candidates = (headers.get(h.REPLY_TO), claimed.get("reply_to"))
        allowed = [r for r in candidates if isinstance(r, str) and is_reply_subject(r)]
        allowed = [r for r in allowed if policy(r)]
        return Task(
            v=1,
            message_id=message_id,
            trace_id=trace_id,
            topic=_token_or(topic, INVALID_TOPIC),
            reply_to=allowed[0] if allowed else None,
            caller=sender,  # its sender reads the dead letter's event in its own trace
        )

    async def _invalid(self, msg: Delivery, stub: Task, exc: DecodeError) -> None:
        error = ErrorInfo(type="invalid_envelope", message=str(exc), retryable=False)
        raw = _kept(msg.data)
        log.warning(
            "invalid envelope", message_id=stub.message_id, subject=msg.subject, error=str(exc)
        )
        await dead_letter(
            self._broker,
            reason="invalid_envelope",
            message_id=stub.message_id,
            trace_id=stub.trace_id,
            topic=stub.topic,
            error=error,
            raw=raw,
            # The subject names the caller, which a worker tells (the body may say nothing).
            headers={**(msg.headers or {}), "Reach-Subject": msg.subject},
            truncated=len(raw) < len(msg.data),
            caller=stub.caller,
        )
        if stub.reply_to:
            answer = error_reply(stub, error, "invalid_envelope", attempts=0)  # nothing began
            await reply(self._broker, stub, answer)


def _kept(data: bytes) -> bytes:
    """The first :data:`RAW_KEPT` characters of an invalid body (bytes, when it is not
    UTF-8): a sender's malformed megabyte is not kept whole for the dead letters' 30 days."""
    try:
        return data.decode("utf-8")[:RAW_KEPT].encode("utf-8")
    except UnicodeDecodeError:
        return data[:RAW_KEPT]


def _claimed_ids(data: bytes) -> dict[str, object]:
    """The ids an invalid envelope claims, so its dead letter can be found by them."""
    try:
        document = decode_json(data)
    except DecodeError:
        return {}
    return document if isinstance(document, dict) else {}


def _token_or(value: object, fallback: str) -> str:
    return value if is_token(value) else fallback  # type: ignore[return-value]
