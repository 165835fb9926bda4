"""The dashboard's alerts are the rules of deploy/prometheus/alerts.yml, judged over its own
history: same thresholds, `for` and guards; summaries that carry the value."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from nats.js import api

from agentreach.broker import Broker, Topology, provision
from agentreach.dashboard import Board, History
from agentreach.dashboard.alerts import RULES, judge
from agentreach.envelopes import Event, now_ms

ALERTS_YML = Path(__file__).parents[2] / "deploy" / "prometheus" / "alerts.yml"
COMPARISON = re.compile(r"(?<![=!<>])(>=|<=|<|>)\s*(\d+(?:\.\d+)?)")


def rules_in_yml() -> dict[str, dict[str, Any]]:
    groups = msgspec.yaml.decode(ALERTS_YML.read_bytes())["groups"]
    five = next(g for g in groups if g["name"] == "reach-five-metrics")
    return {rule["alert"]: rule for rule in five["rules"] if "alert" in rule}


def seconds(duration: str | None) -> int:
    if duration is None:
        return 0
    number, unit = int(duration[:-1]), duration[-1]
    return number * {"s": 1, "m": 60, "h": 3600}[unit]


def test_each_alert_has_the_threshold_for_and_guard_of_its_rule_in_alerts_yml():
    """Every alert of the five metrics in alerts.yml is judged by the dashboard, with the
    rule's comparison, `for` and severity, and the P99's completions guard (of the period
    judged and of the one before): a change to one side fails here until both agree."""
    found = rules_in_yml()
    assert {rule.alert for rule in RULES.values()} == set(found)
    for key, rule in RULES.items():
        yml = found[rule.alert]
        comparisons = [(op, float(n)) for op, n in COMPARISON.findall(yml["expr"])]
        assert comparisons[0] == (rule.op, rule.value), (key, yml["expr"])
        guards = [(">=", float(rule.min_completed))] * 2 if rule.min_completed else []
        assert comparisons[1:] == guards, (key, yml["expr"])
        assert seconds(yml.get("for")) == rule.for_s, key
        assert yml["labels"]["severity"] == rule.severity, key
    period, before = found["ReachLatencyP99Up"]["expr"].split("and on ()")[1:]
    assert "increase(reach_latency_seconds_count[1h])" in period and "offset" not in period
    assert "increase(reach_latency_seconds_count[1h] offset 1h)" in before


def test_thresholds_are_said_from_the_numbers_judged():
    """The text shown beside each metric is made from the rule, so it cannot drift."""
    assert [rule.text(key) for key, rule in RULES.items()] == [
        "< 99.5 % for 2 min",
        "> 1.3 x the period before, for 5 min, of ≥ 100 completions in each",
        ">= 50 % of capacity for 3 min",
        "> 5 % for 2 min",
        "> 0, at once",
    ]


def test_alert_states_wait_out_their_for():
    """Held for less than `for`: pending; for longer: firing; isolated fires at once."""
    step = 10_000

    def rows(key: str, *values: float | None, **more: Any) -> list[tuple[int, dict]]:
        return [(i * step, {key: v, **more}) for i, v in enumerate(values)]

    low = rows("success_rate", *[0.9] * 20)  # 190 s below 99.5 %
    assert judge("success_rate", low[:10])[0] == "pending"  # 90 s < 2 min
    assert judge("success_rate", low) == ("firing", 0)
    assert judge("isolated_agents", rows("isolated_agents", 0, 1))[0] == "firing"
    assert judge("retry_rate", rows("retry_rate", None))[0] == "no_data"
    slower = {"previous": 1.0, "period_completed": 100, "before_completed": 100}
    assert judge("p99_latency", rows("p99_latency", 2.0, **slower))[0] == "pending"
    assert judge("p99_latency", rows("p99_latency", 1.2, **slower))[0] == "ok"
    few_before = {**slower, "before_completed": 21}  # the slowest few are no baseline
    assert judge("p99_latency", rows("p99_latency", 2.0, **few_before))[0] == "ok"


def completed(at_ms: int, latency_ms: int) -> Event:
    return Event(
        v=1,
        event="completed",
        message_id="m",
        trace_id="t",
        topic="x",
        received_ms=at_ms - latency_ms,
    )


def event(kind: str, *, attempt: int = 1, **detail: object) -> Event:
    return Event(
        v=1, event=kind, message_id="m", trace_id="t", topic="x", attempt=attempt, detail=detail
    )


@contextlib.asynccontextmanager
async def board_of(broker: Broker) -> AsyncIterator[Board]:
    async with Board(broker, History(step_s=10, window_s=600, period_s=600)) as board:
        yield board


async def test_p99_is_not_judged_on_fewer_than_100_completions(broker: Broker):
    """21 slow completions after 21 fast ones, held for more than 5 min: the rule's guard
    (>= 100 completions in the period, and in the one before) keeps it quiet, and the
    detail says why; with 121 in both it fires, since the condition held plus its 5 min."""
    async with board_of(broker) as board:
        now = now_ms()

        def fold(count: int, at_ms: int, latency_ms: int) -> None:
            for _ in range(count):
                board.history.fold(completed(at_ms, latency_ms), at_ms)

        fold(21, now - 1_100_000, 40)  # the period before: fast
        for back_s in range(580, 330, -12):  # the last period: 21 slow ones
            fold(1, now - back_s * 1000, 2_000)
        few = board.metrics(full=False)["series"]["p99_latency"]
        quiet = board.alerts(board.metrics(full=False))
        for back_s in range(580, 330, -50):
            fold(20, now - back_s * 1000, 2_000)
        few_before = board.metrics(full=False)["series"]["p99_latency"]
        fold(100, now - 1_100_000, 40)
        metrics = board.metrics(full=False)
        many = metrics["series"]["p99_latency"]
        alerts = board.alerts(metrics)
    assert few["state"] == "ok" and quiet == []
    assert few["detail"] == "21 completed in 10 min: too few to judge (< 100)"
    assert few_before["state"] == "ok"
    assert few_before["detail"] == "121 completed in 10 min, 21 before: too few to compare"
    assert many["state"] == "firing"
    assert many["detail"] == "121 completed in 10 min, 121 before"
    # The page shows "+N % vs before" only then (it showed +7419 % of too few to judge).
    assert (few["comparable"], few_before["comparable"], many["comparable"]) == (
        False,
        False,
        True,
    )
    (alert,) = alerts
    assert alert["name"] == "ReachLatencyP99Up" and alert["severity"] == "warning"
    assert alert["since_ms"] == many["since_ms"] + 300_000  # firing since, not pending since
    assert re.fullmatch(
        r"P99 reach latency: 1\.9\d s, \d+\.\d\d x the period before"  # 2 s: a bucket edge
        r" \(the dashboard's periods; Prometheus's rule compares hours\)"
        r" \(> 1\.3 x the period before, for 5 min, of ≥ 100 completions in each\)",
        alert["summary"],
    ), alert["summary"]


async def test_summaries_carry_the_value_and_details_the_counts(broker: Broker):
    """As docs/dashboard.md shows them: "Queue depth: 58.0 % (> 50 % of capacity for
    3 min)", "1,532 of 1,534 completed, 5 min"; an alert's since_ms is when it began
    firing, so the banner's "for N min" counts from there."""
    async with board_of(broker) as board:
        now = now_ms()
        history = board.history
        for _ in range(1_532):
            history.fold(completed(now - 100_000, 50), now - 100_000)
        for _ in range(2):
            history.fold(event("dead_lettered", reason="expired"), now - 100_000)
        for i in range(240):  # 24 of them retries, from 250 s ago
            history.fold(event("routed", attempt=2 if i < 24 else 1), now - 250_000)
        for back_s in range(240, -1, -2):  # the fullest queue at 58 % for 4 min
            history.sample(now - back_s * 1000, queue_fill=0.58, isolated=0)
        metrics = board.metrics(full=True)
        alerts = {a["metric"]: a for a in board.alerts(metrics)}
    series = metrics["series"]
    assert series["success_rate"]["detail"] == "1,532 of 1,534 completed, 5 min"
    assert series["success_rate"]["state"] == "ok"  # 99.87 %
    assert series["retry_rate"]["detail"] == "24 retries of 240 dispatches, 5 min"
    assert set(alerts) == {"queue_fill", "retry_rate"}
    assert alerts["queue_fill"]["summary"] == "Queue depth: 58.0 % (>= 50 % of capacity for 3 min)"
    assert alerts["retry_rate"]["summary"] == "Retry rate: 10.0 % (> 5 % for 2 min)"
    for key, held_s in (("queue_fill", 180), ("retry_rate", 120)):
        assert alerts[key]["since_ms"] == series[key]["since_ms"] + held_s * 1000


def test_each_queue_is_judged_on_its_own_as_prometheus_does():
    """Two queues taking turns above 50 % every minute, for 4 min: the fullest queue was
    over all along, but no one queue for 3 min, so ReachQueueDepthHigh (per agent and
    priority) would only be pending; one queue over all along fires."""
    now = now_ms()
    turns, steady = History(step_s=10, window_s=600), History(step_s=10, window_s=600)
    for back_s in range(240, -1, -2):
        at = now - back_s * 1000
        turn = "worker-a P1" if (back_s // 60) % 2 else "worker-b P1"
        turns.sample(at, queue_fill=0.58, isolated=0, queues_over={turn})
        steady.sample(at, queue_fill=0.58, isolated=0, queues_over={"worker-a P1"})
    state, since = judge("queue_fill", turns.rows(now))
    assert state == "pending" and since is not None and now - since <= 70_000
    assert judge("queue_fill", steady.rows(now))[0] == "firing"


async def test_the_queue_depth_card_says_what_waits_in_intake(broker: Broker):
    """Every agent gone and tasks waiting to be routed: the queue-depth card's detail says
    how many wait in intake (it read "no agent running" at 0 %, as if nothing waited)."""
    names = broker.names
    await provision(broker, Topology.default(names))
    for n in range(3):
        await broker.publish(names.task("stranded", "c1"), b'{"n": %d}' % n)
    async with board_of(broker) as board:
        consumer = api.ConsumerConfig(
            durable_name=names.coordinator_intake, ack_policy=api.AckPolicy.EXPLICIT
        )
        await broker.js.add_consumer(names.tasks_stream, consumer)
        await board.refresh()
        detail = board.metrics(full=False)["series"]["queue_fill"]["detail"]
    assert detail == "no agent running · 3 in intake, not routed yet"
