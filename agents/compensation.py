"""``CompensationWorker``: consume dead letters and decide — replay, compensate, alert.

A worker hands over only open letters (see :mod:`agentreach.agents.letters` for a letter's
state, and the replay and resolution that settle it)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from agentreach import envelopes
from agentreach.agents.errors import (
    AgentConfigError,
    LetterSettled,
    NothingToReplay,
    ReplayLimitReached,
)
from agentreach.agents.letters import (
    DEFAULT_MAX_REPLAYS,
    UNCHANGED,
    replay,
    resolve,
    settling_of,
)
from agentreach.broker import Auth, Broker, BrokerError, Delivery, Names, PullConsumer
from agentreach.broker.connection import connected
from agentreach.broker.consume import ConsumerSpec, bind
from agentreach.broker.tasks import cancel_and_wait
from agentreach.broker.topology import DAY, DEAD_LETTERS_KEPT_S
from agentreach.envelopes import DEAD_LETTER_REASONS, DeadLetter, DecodeError, Task, is_token
from agentreach.errors import ReachError
from agentreach.logs import get_logger

log = get_logger("agents.compensation")

DeadLetterHandler = Callable[[DeadLetter, "Compensation"], Awaitable[None]]
RETRY_DELAY_S = 5.0  # after a handler's first failure; doubled after each next one
RETRY_DELAY_CAP_S = 300.0


def retry_delay_s(tries: int) -> float:
    """When a letter whose handler failed ``tries`` times comes back: 5 s, 10 s, 20 s …
    up to 5 min (a handler that always fails is not called every 5 s for good)."""
    return min(RETRY_DELAY_CAP_S, RETRY_DELAY_S * 2 ** max(0, tries - 1))


class Compensation:
    """What a handler can do with a dead letter: replay it or mark it resolved."""

    def __init__(
        self, broker: Broker, worker: str, *, max_replays: int = DEFAULT_MAX_REPLAYS
    ) -> None:
        self.broker = broker
        self.worker = worker
        self.max_replays = max_replays

    async def replay(
        self,
        letter: DeadLetter,
        *,
        topic: str | None = None,
        ttl_ms: int | None = None,
        payload: Any = UNCHANGED,
        force: bool = False,
    ) -> Task:
        """Publish the dead-lettered task again, as a new message in the same trace (to
        ``topic``, with ``payload``, when given: a fix of what it was sent with);
        :class:`ReplayLimitReached` when its task was replayed ``max_replays`` times
        already, :class:`LetterSettled` when the letter was replayed or resolved already,
        unless ``force``."""
        return await replay(
            self.broker,
            letter,
            topic=topic,
            ttl_ms=ttl_ms,
            payload=payload,
            sender=self.worker,
            max_replays=self.max_replays,
            force=force,
        )

    async def resolve(self, letter: DeadLetter, note: str) -> None:
        """Record that the dead letter was dealt with, and how."""
        await resolve(self.broker, letter, note, by=self.worker, sender=self.worker)


class HandlerTimedOut(Exception):
    """A handler call ran past the worker's ``handler_timeout_s`` and was cancelled."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the handler ran past handler_timeout_s={timeout_s:g}")
        self.timeout_s = timeout_s


FORGOTTEN_AFTER_S = DEAD_LETTERS_KEPT_S + DAY  # a worker's consumer, unused that long
STILL_RUNNING_S = 60.0  # a handler running this long is said, and again each time as long


class CompensationWorker:
    """Consumes ``REACH_DLQ`` filtered by reason and topic, one handler call per entry.

        async def refund_back(letter: DeadLetter, comp: Compensation) -> None:
            await comp.replay(letter, topic="manual_review")

        worker = CompensationWorker("refunds", refund_back, reasons=["expired"])
        async with worker.running(nats_url):
            ...

    Workers with the same name share the work. A handler that raises leaves the
    entry to come back later; one that returns has dealt with it. One whose
    ``comp.replay`` raised :class:`ReplayLimitReached` (the letter's task was replayed
    ``max_replays`` times already) has it acknowledged and logged as an error: it stays
    open for a person (``reach dlq list --open``), and a replay loop ends there.

    A workflow step's letter whose workflow handles the failure (``letter.workflow.handled``:
    it absorbed it, or it ends with a letter of its own) is acknowledged without a handler
    call, and logged: act on the workflow's letter, once. ``include_handled=True`` hands
    those over too. A compensating step's letter is always handed over.

    A letter replayed or resolved already (by a person with ``reach dlq``, the dashboard,
    or another worker) is acknowledged without a handler call, and logged: a worker deployed
    or renamed later (its new durable consumer starts at the stream's first letter) would
    run those tasks again. ``include_settled=True`` hands those over too (``comp.replay``
    still refuses them unless forced).
    """

    def __init__(
        self,
        name: str,
        handler: DeadLetterHandler,
        *,
        reasons: Iterable[str] = ("*",),
        topics: Iterable[str] = ("*",),
        ack_wait: float = 30.0,
        include_handled: bool = False,
        include_settled: bool = False,
        max_replays: int = DEFAULT_MAX_REPLAYS,
        handler_timeout_s: float | None = None,
    ) -> None:
        """``ack_wait``: after it, an entry a dead worker held goes to another (one whose
        handler runs longer is kept alive meanwhile); ``include_handled``: hand over the
        letters of workflow steps whose workflow handles them too; ``include_settled``: hand
        over the letters replayed or resolved already too; ``max_replays``: how
        many replays may lead to a task ``comp.replay`` replays again; ``handler_timeout_s``:
        a handler call running longer is cancelled and its letter comes back later, as after
        a failure (by default a call may run for ever, and this worker's other letters wait)."""
        if isinstance(max_replays, bool) or not isinstance(max_replays, int) or max_replays < 0:
            raise AgentConfigError(f"max_replays={max_replays!r}: expected an int ≥ 0")
        if handler_timeout_s is not None and not (
            isinstance(handler_timeout_s, int | float)
            and not isinstance(handler_timeout_s, bool)
            and 0 < handler_timeout_s < math.inf
        ):
            raise AgentConfigError(
                f"handler_timeout_s={handler_timeout_s!r}: expected seconds > 0, or None"
            )
        self.handler_timeout_s = handler_timeout_s
        if not is_token(name):
            raise AgentConfigError(
                f"worker name {name!r}: use 1-128 letters, digits, '_' or '-' (it names the"
                " worker's durable consumer, compensation-NAME)"
            )
        self.max_replays = max_replays
        self.name = name
        self.include_handled = include_handled
        self.include_settled = include_settled
        self.ack_wait = ack_wait
        self.handler = handler
        self.reasons = tuple(reasons)
        self.topics = tuple(topics)
        if not self.reasons or not self.topics:
            raise ReachError("a CompensationWorker needs at least one reason and one topic")
        for reason in self.reasons:
            if reason != "*" and reason not in DEAD_LETTER_REASONS:
                # A routing rule's `dlq:` may name a reason of its own: said, not refused.
                log.warning(
                    "the coordinator dead-letters with no such reason; only a routing rule"
                    " naming it in `dlq:` would (circuit_open, rate_limited, a handler's"
                    " error type … arrive as `rejected` or `retries_exhausted`: see"
                    " letter.error.type)",
                    reason=reason,
                    reasons=DEAD_LETTER_REASONS,
                )

    @contextlib.asynccontextmanager
    async def running(
        self,
        nats_url: str | None = None,
        *,
        broker: Broker | None = None,
        names: Names | None = None,
        auth: Auth | None = None,
    ) -> AsyncIterator[CompensationWorker]:
        """Consume for the duration of the block."""
        name = f"compensation:{self.name}"
        async with connected(
            broker, nats_url, name=name, names=names, wait=True, auth=auth
        ) as connection:
            self._check_credentials(connection.auth)
            consumer = await bind(connection, self._consumer(connection.names))
            compensation = Compensation(connection, self.name, max_replays=self.max_replays)
            loop = asyncio.create_task(self._consume(consumer, compensation), name=self.name)
            try:
                yield self
            finally:
                await cancel_and_wait(loop)

    def _check_credentials(self, auth: Auth) -> None:
        """A worker's creds let it use the consumer of its own name only: another name's
        creation was refused, and the worker waited for JetStream for ever (a trial)."""
        if auth.role == "worker" and auth.identity not in (None, self.name):
            raise AgentConfigError(
                f"the creds are for worker {auth.identity!r}, but this worker is {self.name!r}:"
                f" its consumer compensation-{self.name} is not theirs to use; name the worker"
                f" {auth.identity!r} or give it creds of its own (`reach auth worker {self.name}`)"
            )

    def _consumer(self, names: Names) -> ConsumerSpec:
        subjects = tuple(names.dlq(r, t) for r in self.reasons for t in self.topics)
        return ConsumerSpec(
            stream=names.dlq_stream,
            durable=f"compensation-{self.name}",
            filter_subjects=subjects,
            ack_wait_s=self.ack_wait,
            # A worker run once under a name of its own would leave its consumer for good.
            # Past the letters' own keeping no position in them is worth anything: a worker
            # back later starts again at the first letter kept, skipping the settled ones.
            inactive_threshold_s=FORGOTTEN_AFTER_S,
        )

    async def _consume(self, consumer: PullConsumer, compensation: Compensation) -> None:
        # One entry at a time: one fetched with others would wait for their handlers, past
        # its ack wait, and be compensated again by another worker meanwhile.
        async for deliveries in consumer.batches(size=1):
            for delivery in deliveries:
                async with delivery.kept_alive(self.ack_wait / 2):
                    await self._handle(delivery, compensation)

    async def _handle(self, msg: Delivery, compensation: Compensation) -> None:
        try:
            letter = envelopes.decode_dead_letter(msg.data, msg.headers, stored=True)
        except DecodeError as exc:
            log.error("unreadable dead letter left in place", subject=msg.subject, error=str(exc))
            await msg.term()
            return
        step = letter.workflow
        if step is not None and step.handled and not self.include_handled:
            log.info(
                "dead letter left to its workflow, which handles it",
                message_id=letter.message_id,
                reason=letter.reason,
                instance_id=step.instance_id,
                step=step.step,
            )
            await msg.ack()
            return
        if not self.include_settled:
            try:
                settled = await self._settled(letter, msg, compensation.broker)
            except BrokerError as exc:  # unknown yet: not handed over, and not dropped
                log.warning("cannot read the dead letter's state", error=str(exc))
                await msg.nak(RETRY_DELAY_S)
                return
            if settled:
                await msg.ack()
                return
        try:
            await self._watched(letter, compensation)
        except ReplayLimitReached as exc:  # trying again later would be refused again
            log.error(
                "replay refused, the dead letter is left open for a person",
                message_id=letter.message_id,
                reason=letter.reason,
                replays=exc.replays,
                max_replays=exc.max_replays,
            )
            await msg.ack()
            return
        except NothingToReplay:  # it never will be: a person fixes the body and resolves it
            log.error(
                "replay refused, the dead letter holds no task; it is left open for a person",
                message_id=letter.message_id,
                reason=letter.reason,
            )
            await msg.ack()
            return
        except LetterSettled as exc:  # settled meanwhile, by someone else: nothing left to do
            log.info(
                "replay refused, the dead letter is settled already",
                message_id=letter.message_id,
                state=exc.state,
                by=exc.by,
            )
            await msg.ack()
            return
        except HandlerTimedOut as exc:  # as a failure: a later try may end in time
            retry_in_s = retry_delay_s(msg.num_delivered)
            log.error(
                "compensation handler timed out and was cancelled",
                message_id=letter.message_id,
                timeout_s=exc.timeout_s,
                tries=msg.num_delivered,
                retry_in_s=retry_in_s,
            )
            await msg.nak(retry_in_s)
            return
        except Exception:  # the entry stays; a fix or a later try may succeed
            retry_in_s = retry_delay_s(msg.num_delivered)
            log.exception(
                "compensation handler failed",
                message_id=letter.message_id,
                tries=msg.num_delivered,
                retry_in_s=retry_in_s,
            )
            await msg.nak(retry_in_s)
            return
        await msg.ack()

    async def _watched(self, letter: DeadLetter, compensation: Compensation) -> None:
        """The handler's call, said every STILL_RUNNING_S while it runs: letters are handled
        one at a time, and one that hung stopped its worker without a word (a trial).
        :class:`HandlerTimedOut` when it ran past ``handler_timeout_s``, once it has ended."""
        call = asyncio.ensure_future(self.handler(letter, compensation))
        try:
            if not await self._ended_in_time(call, letter):
                said = "compensation handler ran past handler_timeout_s: cancelling it"
                log.warning(said, message_id=letter.message_id, timeout_s=self.handler_timeout_s)
                await _cancelled(call, letter)
        except asyncio.CancelledError:  # this worker is stopping
            call.cancel()
            await asyncio.wait({call}, timeout=STILL_RUNNING_S)
            raise
        if call.cancelled():
            raise HandlerTimedOut(self.handler_timeout_s or math.inf)
        call.result()  # one that went on and returned dealt with the letter all the same

    async def _ended_in_time(self, call: asyncio.Future[None], letter: DeadLetter) -> bool:
        limit_s = self.handler_timeout_s if self.handler_timeout_s is not None else math.inf
        started = time.monotonic()
        while (left_s := limit_s - (time.monotonic() - started)) > 0:
            if (await asyncio.wait({call}, timeout=min(STILL_RUNNING_S, left_s)))[0]:
                return True
            if (running_s := time.monotonic() - started) < limit_s:
                log.warning(
                    "compensation handler still running; this worker's other letters wait",
                    message_id=letter.message_id,
                    running_s=round(running_s, 1),
                    handler_timeout_s=self.handler_timeout_s,
                )
        return False

    async def _settled(self, letter: DeadLetter, msg: Delivery, broker: Broker) -> bool:
        """Whether the letter was replayed or resolved already, by another than this worker
        or in a handler call that returned; logged when it was."""
        settling = await settling_of(broker, letter)
        if not settling:
            return False
        last = settling[-1]
        if msg.num_delivered > 1 and last.detail.get("by") == self.name:
            # Settled by this worker in a handler call that raised or did not end (it was
            # not acknowledged): called again, to do the steps after (its replay returns the
            # one it made, nothing is sent twice).
            log.info(
                "dead letter handed over again: this worker settled it in a call that did not"
                " finish",
                message_id=letter.message_id,
                state=last.event,
            )
            return False
        log.info(
            "dead letter skipped, it is settled already",
            message_id=letter.message_id,
            reason=letter.reason,
            state=last.event,
            by=last.detail.get("by"),
            at_ms=last.at_ms,
        )
        return True


async def _cancelled(call: asyncio.Future[None], letter: DeadLetter) -> None:
    """Cancel ``call`` and wait for it to end: one that goes on (it swallowed the
    cancellation) keeps its letter, which would else be handed over again while it runs,
    and its compensation done twice (a review)."""
    call.cancel()
    while not (await asyncio.wait({call}, timeout=STILL_RUNNING_S))[0]:
        log.error(
            "compensation handler goes on after its cancellation (it must let it through);"
            " its letter is held until it ends",
            message_id=letter.message_id,
        )
