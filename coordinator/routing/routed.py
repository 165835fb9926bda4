"""The ``routed`` event: whom a task went to, and the basis of the decision, as its trace
and its audit record show them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import msgspec

from agentreach.broker.lifecycle import event_for
from agentreach.coordinator.routing.fleet import Choice
from agentreach.coordinator.routing.rules import Decision
from agentreach.envelopes import Event, Task
from agentreach.envelopes.audit import summary_of_task

SHOWN = 20  # candidates and passed-over agents listed in a routed event


def routed_event(routed: Task, decision: Decision, choice: Choice, *, sent_topic: str) -> Event:
    """The event of ``routed`` (the task as dispatched) going to ``choice.agent``;
    ``sent_topic``: the topic it was sent on (a rule or the resolution may route it to
    another)."""
    assert choice.agent is not None
    passed_over = dict(list(choice.passed_over.items())[:SHOWN])
    detail: dict[str, object] = {
        "rule": decision.rule.name,
        "pool": choice.pool,
        "candidates": sorted(choice.candidates)[:SHOWN],
        "candidates_total": choice.registered,
        "passed_over": passed_over,
        # What a follower of the attempt needs once its dispatch is acknowledged and gone
        # (:mod:`~agentreach.coordinator.delivery.unreported`).
        "ttl_ms": routed.ttl_ms,
        "execute_ms": routed.budget.execute_ms,
    }
    if routed.reply_to:
        detail["reply_to"] = routed.reply_to
    if choice.trial_key:
        detail["trial"] = choice.trial_key
    if routed.attempt == 1:  # what the message's audit record summarises as its input
        detail["input"] = msgspec.to_builtins(summary_of_task(routed))
        # What a caller sending its id again compares its request with (broker.endings).
        detail["sent_topic"] = sent_topic
    if routed.resolution is not None:
        detail["resolution"] = msgspec.to_builtins(routed.resolution)
        detail["needed"] = decision.needed
    if decision.below:
        detail["below"] = True
    if decision.not_compared:  # rules a value of another type passed over, unsaid otherwise
        detail["rules_not_compared"] = dict(list(decision.not_compared.items())[:SHOWN])
    return event_for(routed, "routed", agent_id=choice.agent.agent_id, **detail)


async def together(*steps: Coroutine[Any, Any, Any]) -> Any:
    """Run a routing's writes at once, in order (the notice, ``routed``, the dispatch); raise
    the last failure (the dispatch is last), or return what the last step returned."""
    outcomes = await asyncio.gather(*steps, return_exceptions=True)
    for outcome in reversed(outcomes):
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes[-1]
