"""ReachClient's public calls: what they take, and what a wrong argument or a missing
coordinator makes them say."""

from __future__ import annotations

import inspect
from collections import Counter

from agentreach.agents import ReachClient
from tests.e2e.routing_support import fast, serving, table, worker

TIERS = """
rules:
  - name: gold
    match: {topic: work, where: [{field: header.X-Tier, op: "==", value: gold}]}
    to: {tags: "tier=gold"}
  - {name: rest, fallback: true, to: {tags: "tier=plain"}}
"""


async def test_invoke_sends_headers_that_routing_rules_match(broker, start_coordinator):
    """invoke(headers=...) puts them on the task, so a header.<Name> rule routes it."""
    counts: Counter[str] = Counter()
    fleet = [worker(f"{tier}-1", counts, tags={"tier": tier}) for tier in ("gold", "plain")]
    async with (
        start_coordinator(fast(routing=table(TIERS))) as coordinator,
        serving(broker, coordinator, *fleet),
        ReachClient(broker=broker) as client,
    ):
        gold = await client.invoke("work", {}, headers={"X-Tier": "gold"})
        plain = await client.invoke("work", {})
    assert (gold, plain) == ({"by": "gold-1"}, {"by": "plain-1"})


def test_publish_names_the_options_of_task():
    """publish() takes task()'s options by name, with the same defaults and types: no
    ``**options`` that hides them from editors and type checkers."""
    task = inspect.signature(ReachClient.task).parameters
    publish = inspect.signature(ReachClient.publish).parameters
    assert not [p for p in publish.values() if p.kind is p.VAR_KEYWORD]
    assert [(p.name, p.kind, p.default, p.annotation) for p in publish.values()] == [
        (p.name, p.kind, p.default, p.annotation) for p in task.values()
    ]


def test_invoke_takes_every_option_of_task_it_does_not_set_itself():
    """invoke() takes all of task()'s options but reply_to (its own box) and budget (its
    ack_deadline_ms and execute_deadline_ms)."""
    task = set(inspect.signature(ReachClient.task).parameters) - {"reply_to", "budget"}
    invoke = set(inspect.signature(ReachClient.invoke).parameters)
    assert task <= invoke, sorted(task - invoke)
