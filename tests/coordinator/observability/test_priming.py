"""Series at 0 for the dead-letter reasons routing rules name, against a real nats-server."""

from __future__ import annotations

import msgspec

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.coordinator.routing.rules import RoutingConfig
from agentreach.envelopes import PRIORITIES
from tests.coordinator.observability.test_metrics import WITH_METRICS, _with_topic
from tests.e2e.routing_support import table
from tests.scrape import scrape
from tests.support import Watcher, until_true

RULES = """
rules:
  - name: retired
    match: {topic: "legacy-*"}
    to: {dlq: retired}
  - name: too-big
    match: {topic: double, where: [{field: payload.n, op: ">", value: 100}]}
    to: {dlq: too_big}
  - {name: fallback, fallback: true, to: {}}
"""

FINISHED = "reach_tasks_finished_total"


def finished(found: dict, topic: str, reason: str, priority: str = "P1") -> float | None:
    key = (("outcome", reason), ("priority", priority), ("topic", topic))
    return found.get((FINISHED, key))


def dead_letters(found: dict, topic: str, reason: str) -> float | None:
    return found.get(("reach_dead_letters_total", (("reason", reason), ("topic", topic))))


def doubler() -> Agent:
    agent = Agent("priming-double", startup_delay=0)

    @agent.handler("double")
    async def double(ctx: TaskContext, payload: dict) -> dict:
        return {"n": payload["n"] * 2}

    return agent


async def test_a_rules_dead_letter_reason_is_exported_at_0_before_its_first_letter(
    broker, start_coordinator, watcher: Watcher
):
    """`to: {dlq: maintenance}` counted its first letter as a series born at 1, which
    `increase()` reads as 0: the dashboard paged on a success rate Prometheus saw at 1 (an
    operator's trial). A rule's reason is there at 0, on each topic its glob takes and on
    `_other`, from the first scrape after its rules were loaded, reloads included."""
    config = msgspec.structs.replace(WITH_METRICS, routing=table(RULES))
    async with start_coordinator(config) as coordinator, doubler().running(broker=broker):
        found = await until_true(lambda: _with_topic(coordinator.metrics_url, "double"))
        for priority in PRIORITIES:
            assert finished(found, "double", "too_big", priority) == 0
            assert finished(found, "_other", "retired", priority) == 0
            assert finished(found, "_other", "too_big", priority) == 0
        assert dead_letters(found, "double", "too_big") == 0
        assert dead_letters(found, "_other", "retired") == 0
        assert finished(found, "double", "retired") is None  # the glob does not take it

        async with ReachClient(broker=broker) as client:
            big, _ = await client.publish("double", {"n": 500})
            old, _ = await client.publish("legacy-report", {})
        await watcher.dead_letter("too_big", message_id=big)
        await watcher.dead_letter("retired", message_id=old)
        counted = await until_true(
            lambda: _counted(coordinator.metrics_url, ("double", "too_big"), ("_other", "retired"))
        )
        assert dead_letters(counted, "double", "too_big") == 1

        coordinator.router.reload(table(RULES.replace("retired}", "maintenance}")))
        reloaded = await until_true(lambda: _has(coordinator.metrics_url, "_other", "maintenance"))
        assert finished(reloaded, "_other", "maintenance") == 0
        assert finished(reloaded, "double", "maintenance") is None


async def _has(url: str, topic: str, reason: str) -> dict | None:
    found = await scrape(url)  # scrapes are collected at most once a second
    return found if finished(found, topic, reason) is not None else None


async def _counted(url: str, *ends: tuple[str, str]) -> dict | None:
    found = await scrape(url)
    return found if all(finished(found, topic, reason) == 1 for topic, reason in ends) else None


def test_rules_name_their_dead_letter_reasons_with_the_topics_they_take():
    """Each rule's `dlq` (in `to` or `below`, its own or the table's) with its topic glob."""
    routing = msgspec.convert(
        {
            "below": {"dlq": "unsure"},
            "rules": [
                {"name": "a", "match": {"topic": "x*"}, "to": {"dlq": "gone"}},
                {"name": "b", "match": {"topic": "y"}, "to": {}, "below": {"manual": "review"}},
                {"name": "c", "match": {"topic": "z"}, "to": {}},
                {"name": "f", "fallback": True, "to": {"dlq": "no_route"}},
            ],
        },
        RoutingConfig,
    )
    assert routing.dead_letter_reasons() == [
        ("x*", "gone"),
        ("x*", "unsure"),
        ("z", "unsure"),
        ("*", "no_route"),
        ("*", "unsure"),
    ]
