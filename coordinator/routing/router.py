"""Sending a task to an agent that can take it — or saying, at once, why not.

The first matching rule names the destination. Its pools are searched for an agent that is
alive, whose breaker allows the call, whose queue is below the high watermark and whose token
bucket has a token. When none is found:

- nobody serves the destination: the fallback rule, and after it ``no_route``;
- every such agent is full: wait for room (``queues.full_wait_s``), then ``backpressure``;
- every such agent is rate limited: a short bounded wait, then ``rate_limited``;
- every such agent's breaker is open: the fallback rule, then ``circuit_open``;
- they exist but are stopped or not ONLINE: wait within the task's ttl, then ``expired`` (a
  restarting agent picks it up; nothing waits in a dead queue).
- a step its workflow no longer waits for (cancelled, ended): ``cancelled`` (:mod:`.abandoned`).

A task on a resolve topic (``reach.task.auto``) first gets its intent from its text; when
that intent is not sure enough for any rule it goes to the ``below`` destination, by default
a manual-review queue, and never falls back to an agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass

import msgspec
import structlog

from agentreach import envelopes
from agentreach.broker import Broker, SubjectFull, TooLarge
from agentreach.broker.lifecycle import GRANT_HEADER, SEAL_HEADER, about, emit, reply
from agentreach.coordinator.delivery.dead_letters import end_as_stored, end_with_error, refuse
from agentreach.coordinator.delivery.retries import failed_before
from agentreach.coordinator.protection.grants import Grants
from agentreach.coordinator.routing.abandoned import still_wanted
from agentreach.coordinator.routing.fleet import Choice, Excluded, Fleet
from agentreach.coordinator.routing.intents.resolver import Resolving, describe, text_of
from agentreach.coordinator.routing.manual import ManualConfig, ManualQueue
from agentreach.coordinator.routing.routed import routed_event, together
from agentreach.coordinator.routing.routed_here import RoutedHere
from agentreach.coordinator.routing.rules import Decision, RoutingConfig, pools_of
from agentreach.coordinator.routing.run_once import RanAlready, Running, RunOnce, answer_from_record
from agentreach.coordinator.routing.waits import Waits
from agentreach.envelopes import ErrorInfo, Routed, Task, now_ms, tracecontext
from agentreach.envelopes import headers as h
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.router")
_NOT_COMPARED_SAID = RepeatedLines(60.0)  # a line a minute per rule, not one per task

WAIT_CAP_S = 1.0  # the longest wait for a run elsewhere to finish before looking again
MAX_PICKS = 8  # agents tried for one task before giving up on this pass


class Router:
    """Chooses an agent for a task by the rules and dispatches it on its priority stream."""

    def __init__(
        self,
        broker: Broker,
        fleet: Fleet,
        routing: RoutingConfig,
        grants: Grants | None = None,
        *,
        manual: ManualQueue | None = None,
    ) -> None:
        self._broker = broker
        self.fleet = fleet
        self.limiter = fleet.limiter
        self.manual = manual or ManualQueue(broker, ManualConfig())
        self.routing = routing
        self.resolving = Resolving(fleet.directory, routing.resolve)
        self._grants = grants or Grants(None)
        self._run_once = RunOnce(broker, self._grants)
        self._waits = Waits()
        self._routed_here = RoutedHere()

    @property
    def waiting_for_room(self) -> Collection[str]:
        """Tasks that found every candidate's queue full and wait for room (on this replica)."""
        return self._waits.waiting_for_room

    def held_by_topic(self) -> dict[str, int]:
        """Tasks this replica holds back because no agent can take them now, by topic."""
        return self._waits.held_by_topic()

    def reload(self, routing: RoutingConfig) -> None:
        """Use ``routing`` from the next decision on; decisions under way finish as they are."""
        self.routing = routing
        if not self.resolving.same(routing.resolve):
            self.resolving = Resolving(self.fleet.directory, routing.resolve)
        log.info("routing rules loaded", rules=[r.name for r in routing.rules])

    async def dispatch(
        self,
        task: Task,
        *,
        left_ms: int,
        origin: str,
        waited: int = 0,
        where: str = "intake",
    ) -> float | None:
        """Dispatch ``task`` with ``left_ms`` of its ttl left (the envelope carries that on).

        Returns None once the task is dispatched or ended, or the seconds to wait
        before asking again when its agents exist but none can take it now;
        ``waited`` counts the times it has waited already. ``origin`` names the stored
        message this decision answers (``t<seq>`` of intake, ``e<seq>`` of an outcome):
        the same decision made again after a crash is then dropped as a duplicate, while
        a task sent again with the same id is dispatched (and answered by its agent from
        the execution record). One back again (``waited``) whose decision was stored before
        and failed after (see :mod:`routed_here`) ends as that decision said.
        """
        if waited and self._routed_here.unsure(task) and await end_as_stored(self._broker, task):
            return None
        with self._routed_here.noting(task):
            return await self._decided(task, left_ms, origin, waited, where)

    async def _decided(
        self, task: Task, left_ms: int, origin: str, waited: int, where: str
    ) -> float | None:
        if where == "intake" and waited == 0 and left_ms > 0 and not await self._topic_admits(task):
            return None
        # Looked at before an expiry too: the ending of a run whose ack was lost (a server
        # failing over) comes back after the ack wait, often past the ttl; its work is done.
        breaks = self._broker.link.breaks  # the dispatch goes only while this read holds
        match await self._run_once.verdict(task, now_ms() + left_ms):
            case RanAlready(record=record):
                await answer_from_record(self._broker, task, record)
                return None
            case Running(left_s=left_s):
                log.info("an agent runs it now; waiting", left_s=round(left_s, 3))
                return min(left_s + 0.05, WAIT_CAP_S)
        if (task := await still_wanted(self._broker, task)) is None:
            return None
        if left_ms <= 0:
            await self.end(task, "expired", self._expiry(task, where, waited))
            return None
        if where == "intake" and (task := await self._resolved(task)) is None:
            return None
        decision = self.routing.decide(task)
        for rule, why in decision.not_compared.items():  # a mistake in a rule, or a sender's
            if (unsaid := _NOT_COMPARED_SAID.due(rule)) is not None:
                log.warning("a rule passed a task over: a value of another type", rule=rule,
                            why=why, message_id=task.message_id, more_not_said=unsaid)  # fmt: skip
        return await self._route(_Pending(task, left_ms, waited, origin, breaks), decision)

    async def _resolved(self, task: Task) -> Task | None:
        """``task`` with its intent found from its text when it needs that; None when it
        needed it and cannot have it (ended as ``no_route``, saying what to install)."""
        if task.resolution is not None:  # only the coordinator resolves: not taken from senders
            task = msgspec.structs.replace(task, resolution=None)
        if not await self._needs_resolving(task):
            return task
        resolver = self.resolving.resolver()
        if isinstance(resolver, str):
            why = f"topic {task.topic!r} is resolved from its text, but {resolver}"
            await self.end(task, "no_route", why)
            return None
        resolved = await resolver.resolve(task)
        assert resolved.resolution is not None
        log.info("resolved", to=describe(resolved.resolution), text_from=task.topic)
        return resolved

    async def _needs_resolving(self, task: Task) -> bool:
        """A resolve topic, or (with ``unknown_topics``) a topic with text that no rule but
        the fallback and no agent serves (workflows were served before the router)."""
        config = self.resolving.config
        if task.topic in config.topics:
            return True
        if not config.unknown_topics or text_of(task.payload, config.text_field) is None:
            return False
        if not self.routing.decide(task).rule.fallback:
            return False
        directory = self.fleet.directory
        if not directory.serving(task.topic):
            await self.fleet.refresh()  # a card written a moment ago may be missing
        return not directory.serving(task.topic)

    async def _route(self, pending: _Pending, decision: Decision) -> float | None:
        task, rule = decision.held(pending.task), decision.rule
        if decision.to.dlq:
            await self.end(task, decision.to.dlq, decision.held_reason(task, "the DLQ"))
            return None
        if decision.to.manual:
            await self.manual.enqueue(
                task,
                queue=decision.to.manual,
                rule=rule.name,
                reason=decision.held_reason(task, "manual review"),
                needed=decision.needed,
            )
            return None
        pools = pools_of(decision.to, task.topic)
        excluded: dict[str, Excluded] = {}
        refreshed = False
        rate_waited_s = 0.0
        choice = Choice()
        for _ in range(MAX_PICKS):
            choice = self.fleet.choose(pools, task.priority, excluded)
            if choice.registered == 0 and not refreshed:
                await self.fleet.refresh()  # a card written a moment ago may be missing
                refreshed = True
                continue
            if choice.agent is None:
                wait_s = self._rate_wait(choice, rate_waited_s)
                if wait_s is None:
                    break
                await asyncio.sleep(wait_s)
                rate_waited_s += wait_s
                continue
            refusal = await self._send(pending, decision, choice)
            if refusal is None:
                return None
            if refusal[0] != "rate":  # a rate limit is seen, with its wait, on the next pick
                excluded[choice.agent.agent_id] = refusal
        return await self._unroutable(pending, decision, choice)

    def _expiry(self, task: Task, where: str, waited: int) -> str:
        """Why ``task`` expired: its ttl, and, when it waited, the agents that could not take it."""
        said = f"ttl {task.ttl_ms} ms passed in {where}"
        if task.attempt > 1:  # its ttl is what was left when the attempt was scheduled
            left = f"{task.ttl_ms} ms of it were left when attempt {task.attempt} was scheduled"
            said = f"its ttl passed in {where} ({left})"
            if task.attempt - task.requeued > 1:  # said to a worker that reads only the reason
                said += "; an earlier attempt began, and its effect may have happened"
        pools = pools_of(self.routing.decide(task).to, task.topic) if waited else ()
        choice = self.fleet.choose(pools, task.priority, {})
        if choice.agent is not None or not choice.passed_over:
            return said
        return choice.why(f"{said}, waiting: no agent could take it", task.topic)

    def _rate_wait(self, choice: Choice, waited_s: float) -> float | None:
        """How long to wait for a token when only rate limits stand in the way; else None."""
        if set(choice.hindrances) - {"rate", "down"} or "rate" not in choice.hindrances:
            return None
        if waited_s + choice.rate_wait_s > self.limiter.config.wait_s:
            return None
        return choice.rate_wait_s

    async def _send(self, pending: _Pending, decision: Decision, choice: Choice) -> Excluded | None:
        """Dispatch to the chosen agent; None when sent (or ended), else why that agent
        refused. Its place in the agent's queue is taken before anything is awaited (tasks
        routed together must not all see the same room), and given back unless stored."""
        task, card = pending.task, choice.agent
        assert card is not None
        self.fleet.reserve(card.agent_id, task.priority, task.message_id)
        outcome: int | Excluded | None = None
        try:
            outcome = await self._dispatch(pending, decision, choice)
        finally:
            if isinstance(outcome, int):  # stored as that stream sequence
                self.fleet.dispatched(card.agent_id, task.priority, task.message_id, outcome)
            else:
                self.fleet.not_dispatched(card.agent_id, task.priority, task.message_id)
        return None if isinstance(outcome, int) else outcome

    async def _dispatch(
        self, pending: _Pending, decision: Decision, choice: Choice
    ) -> int | Excluded | None:
        """The dispatch's stream sequence once stored; else why not (None: ended)."""
        task, card = pending.task, choice.agent
        assert card is not None
        if (refusal := await self.fleet.admit(choice, task.message_id)) is not None:
            return refusal
        routed = msgspec.structs.replace(
            task,
            topic=choice.intent,
            to_agent=card.agent_id,
            ttl_ms=pending.left_ms,
            # The dispatch is a hop of its own in the caller's trace (W3C trace context).
            traceparent=tracecontext.child(task.traceparent, task.message_id, task.attempt),
        )
        subject = self._broker.names.dispatch(card.agent_id, task.priority)
        dedup = f"{task.message_id}-{task.attempt}-{pending.origin}"
        headers = h.task_headers(routed, msg_id=dedup)
        if grant := self._grants.sign(routed, card.agent_id):
            headers[GRANT_HEADER] = grant
            headers[SEAL_HEADER] = self._grants.seal(  # type: ignore[assignment]
                routed.caller, routed.message_id, routed.attempt, card.agent_id
            )
        try:
            # The notice to the sender, the routed event and the dispatch leave together, in
            # that order on the wire (one write, one round trip): the sender learns whose
            # replies to expect, and the stream has `routed`, before that agent can say
            # anything. A failure sends the decision round again (the ids deduplicate).
            # None of them goes out after a break of the connection that followed the
            # run-once read: the dispatch, retried for an election's length, ran the task
            # beside another replica's route (a chaos run); the others told of a route
            # never taken.
            since_break = pending.breaks
            event = routed_event(routed, decision, choice, sent_topic=task.topic)
            stored = await together(
                self._notify(routed, card.agent_id, since_break),
                emit(self._broker, event, since_break=since_break),
                self._broker.publish(
                    subject, envelopes.encode(routed), headers=headers, since_break=since_break
                ),
            )
        except SubjectFull:
            log.info("agent queue full; trying another", agent_id=card.agent_id)
            return self.fleet.refused(card.agent_id, task.priority)
        except TooLarge:  # the envelope grew past the server's limit: it can never be sent
            message = f"the task is larger than the server's {self._broker.max_payload} bytes"
            error = ErrorInfo(type="too_large", message=message, retryable=False)
            await end_with_error(self._broker, task, "rejected", error, started=False)
            return None
        self._waits.done(task)
        log.debug("routed", agent_id=card.agent_id, rule=decision.rule.name, attempt=task.attempt)
        return int(stored.seq)

    async def _notify(self, routed: Task, agent_id: str, since_break: int) -> None:
        if routed.reply_to and self._broker.names.signed_reply(routed.reply_to):  # a reply box
            notice = Routed(**about(routed), agent_id=agent_id)
            await reply(self._broker, routed, notice, since_break=since_break)

    async def _unroutable(
        self, pending: _Pending, decision: Decision, choice: Choice
    ) -> float | None:
        task, waited = pending.task, pending.waited
        hindrances = choice.hindrances
        if hindrances["full"]:
            limit_s = self.fleet.queues.full_wait_s
            if (
                wait_s := self._waits.room_wait(task, waited, pending.left_ms, limit_s)
            ) is not None:
                return wait_s
            await self.reject(task, "backpressure", choice.why("every queue is full", task.topic))
            return None
        if hindrances["rate"]:
            await self.reject(task, "rate_limited", choice.why("all over their rate", task.topic))
            return None
        if choice.registered == 0 or hindrances["circuit"]:
            return await self._fall_back(pending, decision, choice)
        return self._waits.agent_wait(task, waited, pending.left_ms)

    async def _fall_back(
        self, pending: _Pending, decision: Decision, choice: Choice
    ) -> float | None:
        task, fallback = pending.task, self.routing.fallback
        # A task sent where the unsure ones go never falls back to a pool of agents.
        if not decision.rule.fallback and not decision.below:
            log.info("falling back", rule=decision.rule.name, fallback=fallback.name)
            return await self._route(pending, Decision(fallback, fallback.to, decision.needed))
        if choice.registered == 0:
            await self.end(task, "no_route", self.fleet.no_route(task.topic))
        else:
            why, retry_ms = self.fleet.circuit_open(choice, task.topic)
            why += await failed_before(self._broker, task)
            await self.reject(task, "circuit_open", why, retry_after_ms=retry_ms)
        return None

    async def _topic_admits(self, task: Task) -> bool:
        """Take the topic's token, waiting briefly if need be; False when it was rejected."""
        waited_s = 0.0
        while (wait_s := self.limiter.topic_wait(task.topic, task.caller)) > 0:
            if waited_s + wait_s > self.limiter.config.wait_s:
                why, ms, letter = self.limiter.topic_refusal(task)
                await self.over_rate(task, why, ms, letter=letter)
                return False
            await asyncio.sleep(wait_s)
            waited_s += wait_s
        return True

    async def end(self, task: Task, reason: str, message: str, *, started: bool = False) -> None:
        """End ``task`` for good as ``reason`` (not retryable); ``started``: its present
        attempt ran (one whose retry falls past the ttl), and counts among its attempts."""
        error = ErrorInfo(type=reason, message=message, retryable=False)
        await end_with_error(self._broker, task, reason, error, started=started)

    async def reject(
        self, task: Task, kind: str, message: str, *, retry_after_ms: int | None = None
    ) -> None:
        """Refuse ``task`` now as ``kind`` (backpressure, circuit_open, …), dead-lettered as
        ``rejected``; it may be sent again (after ``retry_after_ms``, when given)."""
        error = ErrorInfo(type=kind, message=message, retryable=True, retry_after_ms=retry_after_ms)
        await end_with_error(self._broker, task, "rejected", error, started=False)

    async def over_rate(
        self, task: Task, why: str, retry_after_ms: int, *, letter: bool, **detail: object
    ) -> None:
        """Refuse ``task`` as ``rate_limited``, which its sender may cause at will: a
        ``rejected`` event (with ``detail``), and a dead letter only when ``letter``."""
        error = ErrorInfo(
            type="rate_limited", message=why, retryable=True, retry_after_ms=retry_after_ms
        )
        await refuse(self._broker, task, error, letter=letter, **detail)


@dataclass(frozen=True, slots=True)
class _Pending:
    """One routing decision under way: the task, what is left of its ttl, how often it
    waited already, and which stored message it answers."""

    task: Task
    left_ms: int
    waited: int
    origin: str
    breaks: int  # the connection's breaks when the run-once read was made
