"""Routing rules: matching and config errors, as tables (no server needed)."""

from __future__ import annotations

import msgspec
import pytest

from agentreach.coordinator import ConfigError, load_config
from agentreach.coordinator.config import CoordinatorConfig
from agentreach.coordinator.routing.rules import (
    Condition,
    Match,
    RoutingConfig,
    parse_tags,
    pools_of,
)
from agentreach.envelopes import Task


def task(topic: str = "refund", payload: object = None, **fields: object) -> Task:
    return Task(v=1, message_id="m1", trace_id="t1", topic=topic, payload=payload, **fields)


REFUND = task(
    payload={"amount": 1500, "region": "cn-east", "customer": {"tier": "gold"}},
    priority="P0",
    headers={"X-Channel": "app"},
)


@pytest.mark.parametrize(
    ("field", "op", "value", "expected"),
    [
        ("payload.amount", ">=", 1000, True),
        ("payload.amount", "<", 1000, False),
        ("payload.amount", "<=", 1500, True),
        ("payload.amount", ">", 1500, False),
        ("payload.amount", "==", 1500, True),
        ("payload.amount", "!=", 1500, False),
        ("payload.region", "in", ["cn-east", "cn-north"], True),
        ("payload.region", "in", ["us-west"], False),
        ("payload.customer.tier", "==", "gold", True),
        ("payload.customer.name", "exists", True, False),
        ("payload.customer.name", "exists", False, True),
        ("payload.customer", "exists", None, True),
        ("payload.amount", "<", "a string", False),  # not comparable: no match, no error
        ("payload.missing", "!=", 3, False),  # a missing field matches no comparison
        ("header.X-Channel", "==", "app", True),
        ("header.X-Other", "exists", True, False),
        ("priority", "==", "P0", True),
        ("priority", "in", ["P1", "P2"], False),
        ("attempt", ">", 1, False),
    ],
)
def test_condition_operators(field: str, op: str, value: object, expected: bool) -> None:
    """Each operator compares the named field of the task."""
    condition = msgspec.convert({"field": field, "op": op, "value": value}, Condition)
    assert condition.holds(REFUND) is expected


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("refund", "refund", True),
        ("refund", "refund_application", False),
        ("refund*", "refund_application", True),
        ("*_review", "manual_review", True),
        ("ref?nd", "refund", True),
        ("*", "anything", True),
    ],
)
def test_topic_globs(pattern: str, topic: str, expected: bool) -> None:
    """A rule's topic is an exact name or a glob."""
    assert Match(topic=pattern).holds(task(topic)) is expected


TABLE = """
routing:
  min_confidence: 0.5
  rules:
    - name: unsure
      confidence: 0.3
      match: {topic: refund}
      to: {intent: never_chosen}
    - name: big-refunds
      match:
        topic: "refund*"
        where: [{field: payload.amount, op: ">=", value: 1000}]
      to: {intent: manual_review}
    - name: vip
      match: {where: [{field: header.X-Tier, op: "==", value: vip}]}
      to: {tags: "role=worker, region=cn-east"}
    - name: fallback
      fallback: true
      to: {dlq: no_route}
"""


def test_first_confident_match_wins(tmp_path) -> None:
    """Rules are tried in order; one below min_confidence is skipped; else the fallback."""
    path = tmp_path / "c.yaml"
    path.write_text(TABLE)
    routing = load_config(path).routing
    assert routing.first_match(task("refund", {"amount": 2000})).name == "big-refunds"
    assert routing.first_match(task("refund", {"amount": 10})).name == "fallback"
    vip = task("other", headers={"X-Tier": "vip"})
    assert routing.first_match(vip).name == "vip"
    assert routing.first_match(task("other")).name == "fallback"


def test_default_table_sends_each_topic_to_its_pool() -> None:
    """Without a table every task goes to the agents serving its topic."""
    routing = CoordinatorConfig().routing
    rule = routing.first_match(task("summarize"))
    assert rule.fallback
    (pool,) = pools_of(rule.to, "summarize")
    assert pool.intent == "summarize" and pool.agent is None and pool.tags == ()


def test_pools_of_splits_and_canaries() -> None:
    """A split gives one pool per branch; a canary a tagged share and the rest."""
    routing = msgspec.convert(
        {
            "rules": [
                {
                    "name": "ab",
                    "to": {
                        "split": [
                            {"weight": 80, "to": {"tags": {"pool": "a"}}},
                            {"weight": 20, "to": {"tags": "pool=b"}, "name": "b"},
                        ]
                    },
                },
                {"name": "fb", "fallback": True, "to": {"canary": {"percent": 5, "tags": "v=2"}}},
            ]
        },
        RoutingConfig,
    )
    a, b = pools_of(routing.rules[0].to, "t")
    assert (a.weight, a.tags, b.label, b.tags) == (80, (("pool", "a"),), "b", (("pool", "b"),))
    canary, stable = pools_of(routing.rules[1].to, "t")
    assert (canary.weight, canary.tags) == (5, (("v", "2"),))
    assert (stable.weight, stable.without_tags) == (95, (("v", "2"),))
    assert canary.admits("x", {"v": "2"}) and not stable.admits("x", {"v": "2"})
    assert stable.admits("y", {"v": "1"}) and stable.admits("z", {})


def test_parse_tags() -> None:
    """The selector string form and the mapping form agree."""
    assert parse_tags("role=worker, region=cn-east") == {"role": "worker", "region": "cn-east"}
    assert parse_tags({"role": "worker"}) == {"role": "worker"}


FALLBACK = "    - {name: fb, fallback: true, to: {dlq: no_route}}\n"


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("    - {name: a, to: {intent: x}}\n", "the last rule must be the fallback"),
        ("", "the last rule must be the fallback"),
        (
            "    - {name: a, to: {intent: x}}\n" + FALLBACK + "    - {name: b, to: {intent: y}}\n",
            "or to `dlq: no_route` - at `$.routing`",
        ),
        (
            "    - {name: a, fallback: true, to: {intent: x}}\n" + FALLBACK,
            "only the last rule may be a fallback",
        ),
        ("    - {name: a, to: {intent: x}}\n" * 2 + FALLBACK, "repeated: ['a']"),
        (
            "    - {name: a, match: {where: [{field: amount, op: '>', value: 1}]}, to: {}}\n"
            + FALLBACK,
            "ttl_ms - at `$.routing.rules[0].match.where[0]`",
        ),
        (
            "    - {name: a, match: {where: [{field: payload.x, op: '~', value: 1}]}, to: {}}\n"
            + FALLBACK,
            "at `$.routing.rules[0].match.where[0].op`",
        ),
        (
            "    - {name: a, match: {where: [{field: payload.x, op: in, value: 1}]}, to: {}}\n"
            + FALLBACK,
            "op 'in' needs a list",
        ),
        (
            "    - {name: a, to: {split: [{weight: 1, to: {}}]}}\n" + FALLBACK,
            "needs at least two branches - at `$.routing.rules[0].to`",
        ),
        (
            "    - {name: a, to: {split: [{weight: 0, to: {}}, {weight: 1, to: {}}]}}\n" + FALLBACK,
            "at `$.routing.rules[0].to.split[0].weight`",
        ),
        (
            "    - {name: a, to: {dlq: no_route, intent: x}}\n" + FALLBACK,
            "'dlq' cannot be combined",
        ),
        (
            "    - {name: a, to: {canary: {percent: 150, tags: v=2}}}\n" + FALLBACK,
            "at `$.routing.rules[0].to.canary.percent`",
        ),
        ("    - {name: a, to: {tags: role}}\n" + FALLBACK, "expected key=value, got 'role'"),
        ("    - {name: a, confidence: 2, to: {}}\n" + FALLBACK, "`$.routing.rules[0].confidence`"),
        ("    - {name: 'a b', to: {}}\n" + FALLBACK, "rule name 'a b'"),
        ("    - {name: a, to: {agnet: x}}\n" + FALLBACK, "unknown field `agnet`"),
        (
            "    - {name: a, fallback: true, match: {topic: x}, to: {}}\n",
            "fallback rule 'a' takes every task",
        ),
    ],
)
def test_bad_tables_are_refused_with_the_path(tmp_path, rules: str, message: str) -> None:
    """A bad rule table fails at load time, naming the file and where the mistake is."""
    path = tmp_path / "coordinator.yaml"
    path.write_text("routing:\n  rules:\n" + rules if rules else "routing:\n  rules: []\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("queues: {low_watermark: 0.9}", "low_watermark 0.9 must be below high_watermark 0.8"),
        ("queues: {capacity: {P3: 5}}", "`$.queues.capacity`"),
        ("queues: {capacity: {P0: 0}}", "`$.queues.capacity.P0` (line 1)"),
        ("breakers: {error_ratio: 1.5}", "`$.breakers.error_ratio`"),
        ("rate_limits: {topics: {t: {rate: 0, burst: 1}}}", "`$.rate_limits.topics.t.rate`"),
    ],
)
def test_bad_protection_settings_are_refused(tmp_path, yaml: str, message: str) -> None:
    """Queue, breaker and rate settings are checked at load time too."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value)


def test_the_shipped_example_config_loads() -> None:
    """deploy/coordinator/coordinator.yaml is a valid config that routes as its comments say."""
    from pathlib import Path

    config = load_config(Path(__file__).parents[3] / "deploy/coordinator/coordinator.yaml")
    routing = config.routing
    assert routing.first_match(task("refund", {"amount": 5000})).name == "big-refunds-to-review"
    assert routing.first_match(task("summarize")).name == "summarize-ab"
    assert routing.first_match(task("refund_application", {"amount": 1})).name == "refunds-canary"
    assert routing.fallback.name == "fallback"
    assert config.queues.capacity_of("P0") == 10
    assert config.rate_limits.agents["worker-cn-east-01"].rate == 20


def test_the_shipped_example_workflows_load() -> None:
    """The example config's workflows are valid, each of its form."""
    from pathlib import Path

    config = load_config(Path(__file__).parents[3] / "deploy/coordinator/coordinator.yaml")
    flows = config.workflows
    assert [s.name for s in flows["article"].graph()] == ["plan", "write", "review", "publish"]
    assert flows["research"].graph()[-1].join.quorum == 2
    assert flows["order"].is_machine


@pytest.mark.parametrize(
    ("found", "op", "value", "said"),
    [
        ("5000", ">=", 1000, "payload.x is '5000' (string), not compared with 1000 (number) by >="),
        (5000, "==", "5000", "payload.x is 5000 (number), not compared with '5000' (string) by =="),
        (True, "==", 1, "payload.x is True (boolean), not compared with 1 (number) by =="),
        (1.5, ">", 1, None),  # int and float are both numbers
        (None, "==", 1, None),  # null is no value's type: a plain mismatch
        ("a", "in", [1], None),
        ("a", "exists", True, None),
    ],
)
def test_a_value_of_another_type_than_the_condition_s_is_said(found, op, value, said) -> None:
    """A value of another JSON type never matches (`true` matched `== 1`, as in Python)."""
    condition = Condition(field="payload.x", op=op, value=value)
    assert not condition.holds(task(payload={"x": found})) or said is None
    assert condition.not_compared(found) == said


def test_json_types_are_kept_apart_by_every_operator() -> None:
    for op, value, expected in (("==", 1, False), ("!=", 1, True), (">=", 0, False)):
        assert (
            Condition(field="payload.x", op=op, value=value).holds(task(payload={"x": True}))
            is expected
        ), op
    assert not Condition(field="payload.x", op="in", value=[1, 2]).holds(task(payload={"x": True}))
    assert Condition(field="payload.x", op="in", value=[1.0]).holds(task(payload={"x": 1}))
