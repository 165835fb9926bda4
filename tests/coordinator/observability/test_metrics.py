"""The coordinator's Prometheus metrics, health and readiness, against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, ConsumerSpec, bind
from agentreach.broker.lifecycle import agent_event, emit, event_for
from agentreach.cli.retirement import forget
from agentreach.coordinator import Coordinator, CoordinatorConfig, RateLimits
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.config import shared_settings
from agentreach.coordinator.observability import FlowMetrics, MetricsConfig
from agentreach.coordinator.observability import http as http_module
from agentreach.coordinator.observability.config_drift import config_digest
from agentreach.coordinator.observability.http import HttpError, HttpServer, Request, Response
from agentreach.coordinator.observability.labels import TOPICS_PER_AGENT
from agentreach.coordinator.protection.grants import IMPERSONATIONS_SAID_PER_MINUTE
from agentreach.envelopes import (
    DEAD_LETTER_REASONS,
    PRIORITIES,
    AgentCard,
    Event,
    RateLimit,
    Task,
    encode,
    now_ms,
)
from tests.conftest import FAST
from tests.scrape import http_get, scrape, total
from tests.support import Watcher, events_settled, eventually, scraped, until_true

WITH_METRICS = msgspec.structs.replace(FAST, metrics=MetricsConfig(port=0))


def agents() -> tuple[Agent, Agent]:
    good = Agent("metrics-good", startup_delay=0)

    @good.handler("double", capacity=8)
    async def double(ctx: TaskContext, payload: dict) -> dict:
        return {"n": payload["n"] * 2}

    bad = Agent("metrics-bad", startup_delay=0)

    @bad.handler("explode", capacity=8, max_attempts=1)
    async def explode(ctx: TaskContext, payload: dict) -> dict:
        raise RuntimeError("always fails")

    return good, bad


@contextlib.asynccontextmanager
async def replica(
    broker: Broker, config: CoordinatorConfig = WITH_METRICS
) -> AsyncIterator[Coordinator]:
    async with (
        Broker(broker.url, names=broker.names, name="coordinator") as own,
        Coordinator(own, config).running() as running,
    ):
        yield running


DUTIES = ("liveness", "manual", "queue_expiry")


async def test_two_replicas_count_each_event_once(broker, watcher: Watcher):
    """With two replicas, the sum of their counters is exact, and their gauges agree."""
    good, bad = agents()
    async with (
        replica(broker) as first,
        replica(broker) as second,
        good.running(broker=broker),
        bad.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        ids = [await client.publish("double", {"n": i}) for i in range(12)]
        ids += [await client.publish("explode", {}) for _ in range(3)]
        for message_id, _ in ids[:12]:
            await watcher.event("completed", message_id=message_id)
        for message_id, _ in ids[12:]:
            await watcher.dead_letter("retries_exhausted", message_id=message_id)

        async def counted() -> list[dict] | None:
            found = [await scrape(first.metrics_url), await scrape(second.metrics_url)]
            done = sum(total(f, "reach_tasks_finished_total") for f in found)
            # Read between a lease's hand-over (a renewal late on a loaded machine: CI 124)
            # the two scrapes show it held by none, or by both: read again.
            held = {sum(total(f, "reach_lease_held", duty=duty) for f in found) for duty in DUTIES}
            return found if done >= 15 and held == {1} else None

        found = await until_true(counted)
    finished = [total(f, "reach_tasks_finished_total", topic="double") for f in found]
    assert sum(finished) == 12
    failed = sum(
        total(f, "reach_tasks_finished_total", topic="explode", outcome="retries_exhausted")
        for f in found
    )
    assert failed == 3
    assert sum(total(f, "reach_latency_seconds_count", topic="double") for f in found) == 12
    assert sum(total(f, "reach_dispatches_total") for f in found) == 15
    assert sum(total(f, "reach_tasks_received_total") for f in found) == 15
    assert sum(total(f, "reach_intake_lag_seconds_count") for f in found) == 15
    for f in found:  # state is the same on every replica: the rules take max
        assert total(f, "reach_queue_capacity", priority="P1") == 200
        assert total(f, "reach_agents", state="STOPPED") == 0
        assert total(f, "reach_coordinator_ready") == 1
    for duty in DUTIES:  # one replica runs each duty
        assert sum(total(f, "reach_lease_held", duty=duty) for f in found) == 1


async def test_a_started_replica_counts_once_prometheus_has_read_its_counters_at_0(
    broker, watcher: Watcher
):
    """Events of the time no replica ran were counted before Prometheus's first scrape of
    the restarted one: the counter went 120 then 130, which `increase()` read as +10 where
    30 had ended (an outside trial). The first scrape of a started replica reads its
    counters at 0; what waited is counted after it."""
    good, _ = agents()
    async with (
        replica(broker) as running,
        good.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        ids = [(await client.publish("double", {"n": i}))[0] for i in range(3)]
        for message_id in ids:
            await watcher.event("completed", message_id=message_id)
        first = await scrape(running.metrics_url)

        async def counted() -> dict | None:
            found = await scrape(running.metrics_url)
            return found if total(found, "reach_tasks_finished_total", topic="double") else None

        later = await until_true(counted)
    assert total(first, "reach_tasks_finished_total", topic="double") == 0
    assert total(later, "reach_tasks_finished_total", topic="double") == 3


async def test_every_replica_exports_how_many_replicas_answer(broker):
    """A rule compares it with the targets scraped: a replica that runs unscraped takes its
    share of the events to the grave of its counters, and the sums read low, silently."""
    async with replica(broker) as first, replica(broker) as second:

        async def both_seen() -> list[float] | None:
            seen = [
                total(await scrape(r.metrics_url), "reach_coordinator_replicas")
                for r in (first, second)
            ]
            return seen if seen == [2, 2] else None

        assert await until_true(both_seen, timeout=15) == [2, 2]


async def test_replicas_running_different_configurations_are_said_and_counted(broker):
    """Two replicas, one with a caller quota the other lacks: which replica took a task
    decided its fate, and nothing said so (a trial). Each status names a digest of the
    configuration it runs; every replica counts them, and each warns once while they differ."""
    quota = RateLimits(callers={"default": RateLimit(rate=2, burst=2)})
    other = msgspec.structs.replace(WITH_METRICS, rate_limits=quota)
    with capture_logs() as logs:
        async with replica(broker) as first, replica(broker, other) as second:
            assert first.status()["config_sha256"] != second.status()["config_sha256"]
            for _ in range(2):
                await first._sampled.sample()  # what every replica does every 5 s
            assert total(await scrape(first.metrics_url), "reach_coordinator_configs") == 2
    said = [line for line in logs if line["event"].startswith("the coordinator replicas run")]
    assert 1 <= len(said) <= 2, said  # once per replica, though this one sampled twice
    for line in said:
        assert line["log_level"] == "warning"
        assert sorted(line["replicas"]) == sorted([first.replica_id, second.replica_id])


async def test_replicas_of_one_configuration_count_one(broker):
    """The same settings, whatever differs per host: the metrics port (two replicas on one
    host), the seed list, the creds and seal key paths. With those, they were said to run
    different configurations for good (a security review)."""
    here = msgspec.structs.replace(
        WITH_METRICS,
        metrics=MetricsConfig(port=0, host="127.0.0.2"),
        broker=msgspec.structs.replace(WITH_METRICS.broker, url=broker.url),
    )
    keyed = msgspec.structs.replace(
        here, security=msgspec.structs.replace(here.security, seal_key_file="/elsewhere/key")
    )
    assert config_digest(shared_settings(keyed)) == config_digest(shared_settings(here))
    async with replica(broker) as first, replica(broker, here) as second:
        assert first.status()["config_sha256"] == second.status()["config_sha256"]
        await second._sampled.sample()
        assert total(await scrape(second.metrics_url), "reach_coordinator_configs") == 1


async def test_a_restarted_replica_counts_from_zero_and_misses_nothing(broker, watcher):
    """Counters restart at 0 (no history replayed), and events stored while no replica ran
    are counted by the next one."""
    good, _ = agents()
    async with good.running(broker=broker), ReachClient(broker=broker) as client:
        async with replica(broker) as first:
            for i in range(3):
                await client.invoke("double", {"n": i})
            await until_true(lambda: _finished(first.metrics_url, 3), timeout=10)
        # No replica runs: an event stored now waits in the consumer.
        late = Task(v=1, message_id="late-1", trace_id="late-1", topic="double", received_ms=1)
        await emit(broker, event_for(late, "completed", agent_id="metrics-good", duration_ms=5))
        async with replica(broker) as second:
            await client.invoke("double", {"n": 9})
            found = await until_true(lambda: _finished(second.metrics_url, 2), timeout=10)
    assert total(found, "reach_tasks_finished_total", topic="double") == 2  # not 5


async def _finished(url: str, at_least: int) -> dict | None:
    found = await scrape(url)
    return found if total(found, "reach_tasks_finished_total") >= at_least else None


async def counted(url: str, metric: str, at_least: float = 1, **labels: str) -> dict:
    """A scrape of ``url`` once ``metric`` (with ``labels``) adds up to ``at_least``; the
    fold keeps the stream's order, so every event before the one it counts is counted."""

    async def enough() -> dict | None:
        found = await scrape(url)
        return found if total(found, metric, **labels) >= at_least else None

    return await until_true(enough)


async def test_health_and_readiness(broker):
    """/healthz answers while the process runs; /readyz once connected, provisioned and
    consuming; /metrics carries the five metrics' families."""
    async with replica(broker) as running:
        url = running.metrics_url
        assert await http_get(url + "healthz") == (200, "ok\n")
        assert await http_get(url + "readyz") == (200, "ready\n")
        status, body = await http_get(url + "nowhere")
        assert status == 404 and "metrics" in body
        found = await scrape(url)
        assert total(found, "reach_isolated_agents") == 0
        assert ("reach_metrics_feed_lag_seconds", ()) in found
        running.readiness.serving = False  # as while its views load
        status, body = await http_get(url + "readyz")
        assert status == 503 and "starting" in body

        async def not_ready() -> dict | None:  # a scrape within a second has the last text
            gauges = await scrape(url)
            return gauges if total(gauges, "reach_coordinator_ready") == 0 else None

        gauges = await until_true(not_ready)
        assert not any(name == "reach_isolated_agents" for name, _ in gauges)


async def test_scrapes_back_to_back_collect_once(broker, monkeypatch):
    """Each scrape read every series on the event loop, and anyone who reaches the port may
    scrape: two clients back to back slowed honest calls from 29 to 714 ms (security
    re-test). Scrapes within a second get the last text."""
    collections = 0
    collect = FlowMetrics.collect

    def counted(self):  # type: ignore[no-untyped-def]
        nonlocal collections
        collections += 1
        return collect(self)

    monkeypatch.setattr(FlowMetrics, "collect", counted)
    async with replica(broker) as running:
        await scrape(running.metrics_url)  # the first: made
        before = collections
        texts = await asyncio.gather(*(http_get(running.metrics_url + "metrics") for _ in range(5)))
    assert len({body for _, body in texts}) == 1
    assert collections - before <= 1


async def test_a_taken_preferred_port_is_given_up_when_binding(broker, monkeypatch):
    """Two replicas on one host, both preferring one port (``reach up``'s 9464 by default):
    the second serves on another port instead of exiting; a demanded port stays a demand."""
    async with replica(broker) as first:
        taken = int(first.metrics_url.rsplit(":", 1)[1].strip("/"))
        preferred = MetricsConfig(port=taken, any_port_if_taken=True)
        demanded = MetricsConfig(port=taken)
        async with (
            Broker(broker.url, names=broker.names, name="coordinator") as own,
            Coordinator(own, msgspec.structs.replace(FAST, metrics=preferred)).running() as second,
        ):
            assert second.metrics_url != first.metrics_url
            assert await http_get(second.metrics_url + "healthz") == (200, "ok\n")
        monkeypatch.setattr(http_module, "PORT_WAIT_S", 0.5)  # waited for, then refused
        with pytest.raises(HttpError, match=f"cannot listen on 127.0.0.1:{taken}"):
            async with (
                Broker(broker.url, names=broker.names, name="coordinator") as own,
                Coordinator(own, msgspec.structs.replace(FAST, metrics=demanded)).running(),
            ):
                pass


async def test_a_demanded_port_still_held_by_a_stopping_process_is_waited_for() -> None:
    """A coordinator started again at once in the place of one that drains after SIGTERM:
    its metrics port is taken for a few seconds more, and it waits for it (it exited
    "address already in use")."""

    async def ok(request: Request) -> Response:
        return Response(200, b"ok\n")

    async with HttpServer(ok) as before:
        after = HttpServer(ok, port=before.port)
        with capture_logs() as logs:
            starting = asyncio.create_task(after.__aenter__())
            await eventually(lambda: any(e["event"].startswith("port in use") for e in logs))
        assert not starting.done()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_exit(after)
        await asyncio.wait_for(starting, 10)
        assert after.port == before.port
        assert await http_get(f"http://127.0.0.1:{after.port}/") == (200, "ok\n")


@pytest.mark.parametrize(
    ("kind", "limits"),
    [
        ("quota", RateLimits(callers={"alice": RateLimit(rate=0.001, burst=1)})),
        ("rate_limited", RateLimits(topics={"double": RateLimit(rate=0.001, burst=1)}, wait_s=0)),
    ],
)
async def test_refusals_over_a_rate_are_counted_once_each(broker, watcher, kind, limits):
    """A caller over its quota, or a topic over its rate, is refused with a `rejected`
    event; each refusal counts once in reach_rejections_total (a quota's as `quota`), also
    the one dead-lettered because nobody would hear of it (no reply address: the first, at
    the rate's pace of burst 1). A topic's letters went uncounted (an outside trial: 865 of
    a flood's refusals)."""
    good, _ = agents()
    config = msgspec.structs.replace(WITH_METRICS, rate_limits=limits)
    async with (
        replica(broker, config) as running,
        good.running(broker=broker),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        assert await alice.invoke("double", {"n": 1}) == {"n": 2}  # the burst
        refused = [(await alice.publish("double", {"n": i}))[0] for i in range(5)]
        for message_id in refused:
            await watcher.event("rejected", message_id=message_id)

        await counted(running.metrics_url, "reach_rejections_total", 5)
        # Its dead letter's event may be counted after the refusals (a loaded run).
        found = await counted(running.metrics_url, "reach_dead_letters_total", reason="rejected")
    assert total(found, "reach_rejections_total", kind=kind, topic="double") == 5
    assert total(found, "reach_rejections_total") == 5
    assert total(found, "reach_dead_letters_total", reason="rejected") == 1


async def test_impersonation_alerts_are_counted_and_forged_alerts_are_not(broker, watcher):
    """The coordinator's `alert` events count in reach_alerts_total by problem (both known
    problems exported at 0 from the start); an `alert` an agent sends itself counts not, nor
    does a body of a coordinator's kind it sends under a subject of its own kinds."""
    async with replica(broker) as running:
        before = await scrape(running.metrics_url)
        forged = agent_event("mallory", "alert", problem="impersonation")
        await emit(broker, forged, sender="mallory")
        task = Task(v=1, message_id="imp-1", trace_id="imp-1", topic="double")
        for kind, detail in [("dead_lettered", {"reason": "poison"}), ("routed", {})]:
            body = event_for(task, kind, agent_id="mallory", **detail)
            subject = broker.names.event("failed", "double", "imp-1", "imp-1", "mallory")
            await broker.publish(subject, encode(body), headers={"Reach-Kind": "event"})
        claim = event_for(task, "failed", agent_id="victim", task=msgspec.to_builtins(task))
        await emit(broker, claim, sender="mallory")  # names another agent than its sender

        def raised() -> Event | None:
            alerts = (e for e in watcher.events if e.event == "alert")
            return next((e for e in alerts if e.message_id != forged.message_id), None)

        alert = await watcher.until(raised, "the coordinator's alert")
        assert alert.agent_id == "mallory" and alert.detail["problem"] == "impersonation"

        found = await counted(running.metrics_url, "reach_alerts_total")  # forged ones first
    assert total(before, "reach_alerts_total", problem="impersonation") == 0
    assert total(before, "reach_alerts_total", problem="unresponsive") == 0
    assert total(found, "reach_alerts_total", problem="impersonation") == 1
    assert total(found, "reach_alerts_total") == 1
    assert total(found, "reach_dead_letters_total") == 0
    assert total(found, "reach_dispatches_total") == 0


async def test_a_few_impersonation_alerts_a_minute_are_raised_per_sender(broker, watcher):
    """An agent forging events in another's name under new ids had an alert (and a log line)
    for each: 16,533 in 20 s, 76 MB, every caller slowed (security re-test). A few a minute
    per sender; another sender's are its own."""
    async with replica(broker):
        for n in range(IMPERSONATIONS_SAID_PER_MINUTE + 3):
            task = Task(v=1, message_id=f"imp-{n}", trace_id=f"imp-{n}", topic="double")
            claim = event_for(task, "failed", agent_id="victim", task=msgspec.to_builtins(task))
            await emit(broker, claim, sender="forger")
        other = Task(v=1, message_id="imp-other", trace_id="imp-other", topic="double")
        claim = event_for(other, "failed", agent_id="victim", task=msgspec.to_builtins(other))
        await emit(broker, claim, sender="another")
        await events_settled(broker, broker.names.coordinator_outcomes)

        def alerts(sender: str) -> list[Event]:
            return [e for e in watcher.events if e.event == "alert" and e.agent_id == sender]

        await watcher.until(lambda: alerts("another") or None, "the other sender's alert")
    assert len(alerts("forger")) == IMPERSONATIONS_SAID_PER_MINUTE


async def test_a_completion_by_an_agent_the_attempt_was_not_routed_to_is_not_counted(broker):
    """mallory's `completed` of a task routed to another agent made it a success (its real
    dead letter then went uncounted, as a second ending): the fold remembers routings."""
    task = Task(v=1, message_id="fake-1", trace_id="fake-1", topic="double")
    async with replica(broker) as running:
        await emit(broker, event_for(task, "routed", agent_id="metrics-good"))
        forged = event_for(task, "completed", agent_id="mallory", duration_ms=1)
        await emit(broker, forged, sender="mallory")
        await emit(broker, event_for(task, "dead_lettered", reason="expired"))

        found = await counted(running.metrics_url, "reach_tasks_finished_total")  # forged first
    assert total(found, "reach_tasks_finished_total", outcome="completed") == 0
    assert total(found, "reach_tasks_finished_total", outcome="expired") == 1


async def test_a_report_counts_only_when_a_routing_seen_or_read_vouches_for_it(broker):
    """An agent's `completed` and `failed` of a message id nobody routed were counted (an
    outside trial: three such ghosts put 5.4e9 s in the latency sum, and the success rate
    counted 413 completions of 409 dispatches): a replica could not tell them from reports
    of tasks routed before it started, or folded by the other replica. It reads the
    routings it has not seen: the ghost's count nothing, a real task's report counts, with
    the routing's intake time and priority, not the ones its agent wrote."""
    real = Task(v=1, message_id="seen-1", trace_id="seen-1", topic="double", received_ms=now_ms())
    ghost = Task(v=1, message_id="ghost-1", trace_id="ghost-1", topic="double", received_ms=1000)
    async with replica(broker) as first:
        await emit(broker, event_for(real, "routed", agent_id="metrics-good"))
        await counted(first.metrics_url, "reach_dispatches_total")
    async with replica(broker) as second:  # its fold has not seen that routing
        error = {"type": "boom", "message": "made up", "retryable": True}
        await emit(
            broker, event_for(ghost, "failed", agent_id="mallory", error=error), sender="mallory"
        )
        told = msgspec.structs.replace(real, received_ms=1000, priority="P0")  # made up
        for task, agent in ((ghost, "mallory"), (told, "metrics-good")):
            report = event_for(task, "completed", agent_id=agent, duration_ms=1)
            await emit(broker, report, sender=agent)
        found = await counted(second.metrics_url, "reach_tasks_finished_total")  # ghosts first
    assert total(found, "reach_tasks_finished_total", outcome="completed") == 1
    assert total(found, "reach_tasks_finished_total", outcome="completed", priority="P1") == 1
    assert total(found, "reach_latency_seconds_count") == 1
    assert total(found, "reach_latency_seconds_sum") < 60
    assert total(found, "reach_attempts_failed_total") == 0


def at_zero(found: dict, topic: str) -> list[str]:
    """What is missing or not 0 among the counter series of ``topic`` known before its
    first task (empty when all are there at 0)."""
    by_priority = (
        "reach_retries_total",
        "reach_dispatches_total",
        "reach_tasks_received_total",
    )
    wanted = [(name, {"topic": topic, "priority": p}) for name in by_priority for p in PRIORITIES]
    wanted += [
        ("reach_tasks_finished_total", {"topic": topic, "priority": p, "outcome": outcome})
        for p in PRIORITIES
        for outcome in ("completed", *DEAD_LETTER_REASONS)
    ]
    wanted += [
        ("reach_dead_letters_total", {"reason": r, "topic": topic}) for r in DEAD_LETTER_REASONS
    ]
    wanted += [
        ("reach_rejections_total", {"kind": kind, "topic": topic})
        for kind in ("backpressure", "rate_limited", "circuit_open", "quota")
    ]
    wanted += [
        ("reach_attempts_failed_total", {"topic": topic, "retryable": "true"}),
        ("reach_late_results_total", {"topic": topic}),
        ("reach_execution_seconds_count", {"topic": topic}),
    ]
    wanted += [("reach_latency_seconds_count", {"topic": topic, "priority": p}) for p in PRIORITIES]
    missing = []
    for name, labels in wanted:
        value = found.get((name, tuple(sorted(labels.items()))))
        if value != 0:
            missing.append(f"{name}{labels}: {value}")
    return missing


async def test_known_series_are_exported_at_0_before_their_first_event(broker):
    """rate() loses the first increase of a series that appears at 1, so a fresh replica
    exports at 0 the series of every topic an agent's card lists (each outcome, retries,
    rejections...), of `_other`, of each workflow and of the closed sets; a card
    registered later adds its topic's at the next scrape, on every replica."""
    good, bad = agents()
    twice = wf.chain(wf.step("once", "double"), wf.step("again", "double"))
    config = msgspec.structs.replace(WITH_METRICS, workflows={"twice": twice})
    async with replica(broker, config) as first, good.running(broker=broker):
        found = await until_true(lambda: _with_topic(first.metrics_url, "double"))
        for topic in ("double", "twice", "_other"):
            assert at_zero(found, topic) == [], topic
        assert total(found, "reach_workflows_started_total", workflow="twice") == 0
        for status in ("completed", "failed", "cancelled"):
            key = (("status", status), ("workflow", "twice"))
            assert found[("reach_workflows_finished_total", key)] == 0
        assert found[("reach_alerts_total", (("problem", "other"),))] == 0
        assert found[("reach_breaker_transitions_total", (("scope", "agent"), ("to", "open")))] == 0
        assert ("reach_agent_transitions_total", (("state", "SUSPECT"),)) in found
        assert ("reach_events_folded_total", (("event", "dead_lettered"),)) in found
        assert ("reach_ack_latency_seconds_count", (("priority", "P0"),)) in found
        assert total(found, "reach_dispatches_total") == 0  # no task was sent
        async with bad.running(broker=broker), replica(broker, config) as second:
            later = await until_true(lambda: _with_topic(first.metrics_url, "explode"))
            assert at_zero(later, "explode") == []
            other = await until_true(lambda: _with_topic(second.metrics_url, "explode"))
            assert at_zero(other, "double") == at_zero(other, "explode") == []


async def test_topics_past_the_label_limit_are_counted_as_other(broker, watcher):
    """An agent whose allowance is a pattern rewrote its card with 500 new intents at a
    time: 190 series each, never removed (380,000 series, a 30 MB scrape, after four). The
    agents' topics labelled as themselves are bounded (`metrics.topic_labels`); a
    workflow's are the operator's and always are; the rest count as `_other`."""
    many = Agent("metrics-many", startup_delay=0)
    for n in range(4):

        @many.handler(f"many-{n}")
        async def handle(ctx: TaskContext, payload: dict) -> dict:
            return {}

    flows = {"twice": wf.chain(wf.step("once", "many-0"))}
    metrics = MetricsConfig(port=0, topic_labels=2)
    config = msgspec.structs.replace(FAST, metrics=metrics, workflows=flows)
    with capture_logs() as logs:
        async with replica(broker, config) as running, many.running(broker=broker):
            await watcher.state("metrics-many", "ONLINE")
            async with ReachClient(broker=broker) as client:
                sent = [await client.publish(f"many-{n}", {}) for n in range(4)]
                for message_id, _ in sent:
                    await watcher.event("completed", message_id=message_id)

            def finished(found: dict) -> dict[str, float]:
                done = "reach_tasks_finished_total"
                return {
                    dict(labels)["topic"]: value
                    for (name, labels), value in found.items()
                    if name == done and dict(labels)["outcome"] == "completed" and value
                }

            async def all_counted() -> dict | None:
                found = await scrape(running.metrics_url)
                return found if sum(finished(found).values()) == 4 else None

            found = await until_true(all_counted)
    labelled = {dict(labels).get("topic") for (_, labels) in found} - {None}
    assert "twice" in labelled and "_other" in labelled
    assert len(labelled - {"twice", "_other"}) == 2, labelled
    assert finished(found)["_other"] == 2
    assert any("too many topics to label" in line["event"] for line in logs)


async def test_one_agent_labels_a_share_of_its_topics_and_no_more(broker, watcher):
    """One card of 500 intents took every topic label there was, and then one rewritten
    again and again with 32 new ones: a topic registered after it counted as `_other` until
    a restart (security re-tests). 32 of each agent's topics may be labels, for as long as
    the replica runs; the rest are `_other`, and other agents keep theirs."""
    many = Agent("metrics-squat", startup_delay=0)
    for n in range(TOPICS_PER_AGENT + 4):

        @many.handler(f"sq-{n:02d}")
        async def handle(ctx: TaskContext, payload: dict) -> dict:
            return {}

    later, _ = agents()
    metrics = MetricsConfig(port=0, topic_labels=TOPICS_PER_AGENT + 2)
    async with (
        replica(broker, msgspec.structs.replace(FAST, metrics=metrics)) as running,
        many.running(broker=broker),
    ):
        await watcher.state("metrics-squat", "ONLINE")
        first = await until_true(lambda: _with_topic(running.metrics_url, "sq-00"))
        # Then its card rewritten with new intents: labels are never given back.
        cards = await broker.bucket(broker.names.agents_bucket, AgentCard)
        card = (await cards.get("metrics-squat")).value
        rotated = {f"rot-{n:02d}": card.intents["sq-00"] for n in range(TOPICS_PER_AGENT)}
        await cards.put("metrics-squat", msgspec.structs.replace(card, intents=rotated))
        await eventually(lambda: "rot-00" in running.directory.cards["metrics-squat"].intents)
        async with later.running(broker=broker):
            found = await until_true(lambda: _with_topic(running.metrics_url, "double"))
    labelled = {dict(labels).get("topic") for (_, labels) in first} - {None, "_other"}
    squatted = {t for t in labelled if t.startswith("sq-")}
    assert squatted == {f"sq-{n:02d}" for n in range(TOPICS_PER_AGENT)}
    labelled = {dict(labels).get("topic") for (_, labels) in found} - {None, "_other"}
    assert "double" in labelled
    assert not {t for t in labelled if t.startswith("rot-")}


async def _with_topic(url: str, topic: str) -> dict | None:
    found = await scrape(url)
    listed = ("reach_retries_total", (("priority", "P1"), ("topic", topic)))
    return found if listed in found else None


async def test_a_step_its_workflow_absorbs_is_no_finished_task(broker, watcher):
    """A fan-out branch past its `partial` timeout is dead-lettered `expired` (kept, and
    counted in reach_dead_letters_total) but is not a finished task: the workflow completed,
    and counting the branch too made the success rate page on a fan-out working as designed."""
    good, _ = agents()
    stuck = Agent("metrics-stuck", startup_delay=0)

    @stuck.handler("ponder")
    async def ponder(ctx: TaskContext, payload: object) -> None:
        await asyncio.Event().wait()  # never answers within the branch's timeout

    flow = wf.fanout(
        [wf.step("quick", "double"), wf.step("slow", "ponder", timeout_s=0.5, on_timeout="partial")]
    )
    config = msgspec.structs.replace(WITH_METRICS, workflows={"spread": flow})
    async with (
        replica(broker, config) as running,
        good.running(broker=broker),
        stuck.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        result = await client.invoke("spread", {"n": 2}, execute_deadline_ms=10_000)
        await watcher.dead_letter("expired", topic="ponder")

        async def counted() -> dict | None:
            # Both folded: the caller's answer may come before `workflow_completed` is.
            found = await scrape(running.metrics_url)
            letters = total(found, "reach_dead_letters_total", reason="expired")
            ended = total(found, "reach_workflows_finished_total", workflow="spread")
            return found if letters and ended else None

        found = await until_true(counted)
    assert list(result["missing"]) == ["slow"], result
    assert total(found, "reach_tasks_finished_total", topic="ponder") == 0
    assert total(found, "reach_tasks_finished_total", topic="spread", outcome="completed") == 1


async def test_a_topic_whose_agents_were_forgotten_keeps_its_label(broker, watcher):
    """`no_route` of a topic served before, once its agents were forgotten, was counted as
    `_other` — which the success ratio leaves out as a caller's mistake — and the ratio stayed
    at 100 % (a walkthrough). A topic labelled once stays its own label."""
    good, _ = agents()
    async with replica(broker) as running:
        async with good.running(broker=broker), ReachClient(broker=broker) as client:
            assert await client.invoke("double", {"n": 1}) == {"n": 2}
        await forget(broker, good.agent_id)
        await eventually(lambda: _gone(running, good.agent_id))
        async with ReachClient(broker=broker) as client:
            message_id, _ = await client.publish("double", {"n": 2})
        await watcher.dead_letter("no_route", message_id=message_id)

        found = await counted(running.metrics_url, "reach_dead_letters_total", reason="no_route")
    assert total(found, "reach_dead_letters_total", reason="no_route", topic="double") == 1
    assert total(found, "reach_tasks_finished_total", outcome="no_route", topic="_other") == 0


def _gone(running: Coordinator, agent_id: str) -> bool:
    return agent_id not in running.directory.cards


async def test_events_handed_out_again_are_not_counted_again(broker):
    """The counting consumer acknowledges nothing, and a nats-server killed -9 forgets how
    far it had delivered: it hands its last events out again (an outside operator trial
    counted 101 dispatches of 100 routed). A fold given stored events twice, as two
    consumers from the stream's start hand them, counts each once, and a later one too."""
    names = broker.names
    routed = [Task(v=1, message_id=f"again-{n}", trace_id="again", topic="double") for n in (1, 2)]
    await emit(broker, event_for(routed[0], "routed", agent_id="metrics-good"))
    registry = CollectorRegistry()
    flow = FlowMetrics(registry, lambda topic: True, names=names)
    for durable in ("handed-1", "handed-2"):  # the second hands out the same events again
        spec = ConsumerSpec(
            stream=names.events_stream,
            durable=durable,
            filter_subjects=(names.events_of_kind("routed"),),
            acknowledged=False,
        )
        consumer = await bind(broker, spec)
        if durable == "handed-2":
            await emit(broker, event_for(routed[1], "routed", agent_id="metrics-good"))
        for delivery in await consumer.next_batch(8, wait_s=1.0):
            flow.count(delivery)
    dispatched = scraped(registry)
    assert dispatched("reach_dispatches_total", {"topic": "double", "priority": "P1"}) == 2
