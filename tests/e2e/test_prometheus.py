"""The alert rules under the real promtool, and a real Prometheus scraping a running
coordinator: the five metrics appear and an alert fires for an agent that fails every task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import pytest

from agentreach.agents import ReachClient
from agentreach.broker import Broker
from agentreach.broker.ports import free_ports
from agentreach.coordinator.observability import MetricsConfig
from agentreach.examples.failing import agent as failing_agent
from agentreach.examples.summarize import agent as summarizer
from tests.conftest import FAST
from tests.scrape import http_get
from tests.support import until_true

DEPLOY = Path(__file__).parents[2] / "deploy" / "prometheus"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        reason = f"{name} is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI") or os.environ.get("REACH_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"CI needs it: {reason}")
        pytest.skip(reason)
    return found


def test_alert_rules_pass_promtool():
    """`deploy/prometheus/check`: the config and rules are valid, and their unit tests pass."""
    _tool("promtool")
    run = subprocess.run(
        [str(DEPLOY / "check")], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def _free_port() -> int:
    """Below the ephemeral range: a server restarted on it finds it free (broker.ports)."""
    return free_ports("127.0.0.1", 1)[0]


@contextlib.asynccontextmanager
async def prometheus(target: str, tmp_path: Path) -> AsyncIterator[str]:
    """A real Prometheus scraping ``target`` every second with deploy/prometheus/alerts.yml."""
    binary = _tool("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{DEPLOY / 'alerts.yml'}']\n"
        "scrape_configs:\n"
        "  - job_name: reach-coordinator\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = await asyncio.create_subprocess_exec(
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        async with asyncio.timeout(30):
            while True:
                with contextlib.suppress(OSError):
                    if (await http_get(url + "-/ready"))[0] == 200:
                        break
                await asyncio.sleep(0.2)
        yield url
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)
        log.close()


@contextlib.asynccontextmanager
async def watched(
    broker: Broker, start_coordinator: Any, tmp_path: Path
) -> AsyncIterator[tuple[ReachClient, str]]:
    """A coordinator with metrics, the summarizer and an agent that fails every task, a
    client, and a real Prometheus scraping the coordinator (its URL)."""
    config = msgspec.structs.replace(FAST, metrics=MetricsConfig(port=0))
    async with (
        start_coordinator(config) as coordinator,
        summarizer.running(broker=broker),
        failing_agent.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        target = coordinator.metrics_url.removeprefix("http://").rstrip("/")
        async with prometheus(target, tmp_path) as url:
            yield client, url


async def _query(url: str, expr: str) -> list[dict]:
    status, body = await http_get(f"{url}api/v1/query?query={quote(expr)}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


async def _alerts(url: str) -> dict[str, str]:
    status, body = await http_get(url + "api/v1/alerts")
    assert status == 200, body
    return {a["labels"]["alertname"]: a["state"] for a in json.loads(body)["data"]["alerts"]}


async def test_prometheus_scrapes_the_coordinator_and_an_alert_fires(
    broker, start_coordinator, tmp_path
):
    """With one agent that completes and one that fails every task, Prometheus shows the five
    recording rules, ReachAgentsIsolated fires, and ReachSuccessRateLow is on its way."""
    async with watched(broker, start_coordinator, tmp_path) as (client, url):
        seen: dict[str, object] = {}

        async def load() -> None:  # steady traffic: rate() needs increases between scrapes
            while True:
                await client.publish("summarize", {"text": "NATS is fast. Really."})
                await client.publish("unreliable", {"n": 1})
                await asyncio.sleep(0.2)

        loader = asyncio.create_task(load())
        try:
            async with asyncio.timeout(90):
                while not _done(seen):
                    await asyncio.sleep(1)
                    for rule in RULES:
                        if result := await _query(url, rule):
                            seen[rule] = float(result[0]["value"][1])
                    seen["alerts"] = await _alerts(url)
        except TimeoutError:
            raise AssertionError(f"not all seen in Prometheus: {seen}") from None
        finally:
            loader.cancel()
    alerts = seen["alerts"]
    assert alerts["ReachAgentsIsolated"] == "firing"
    assert alerts["ReachSuccessRateLow"] in ("pending", "firing")
    assert 0 <= seen["reach:success_ratio:rate5m"] < 1
    assert seen["reach:retry_ratio:rate5m"] >= 0  # the isolated agent gets no retries
    assert seen["reach:latency_p99:rate1h"] > 0
    assert seen["reach:isolated_agents:max"] == 1
    assert 0 <= seen["reach:queue_fill:ratio"] < 0.5


RULES = (
    "reach:success_ratio:rate5m",
    "reach:latency_p99:rate1h",
    "reach:queue_fill:ratio",
    "reach:retry_ratio:rate5m",
    "reach:isolated_agents:max",
)


def _done(seen: dict) -> bool:
    alerts = seen.get("alerts") or {}
    rules = all(r in seen for r in RULES)
    return (
        rules
        and alerts.get("ReachAgentsIsolated") == "firing"
        and (alerts.get("ReachSuccessRateLow") in ("pending", "firing"))
    )


async def test_the_first_failures_of_a_fresh_coordinator_reach_the_ratios(
    broker, start_coordinator, watcher, tmp_path
):
    """README's walk-through on a fresh coordinator: 20 summarize tasks complete, then 5
    unreliable ones are dead-lettered, each burst within a scrape or two. The series were
    exported at 0 before the first task, so rate() sees every increase: the success ratio
    drops to about 20/25 and ReachSuccessRateLow is on its way (it stayed 1, and silent,
    while series first appeared at their value)."""
    async with watched(broker, start_coordinator, tmp_path) as (client, url):
        zero = 'reach_tasks_finished_total{topic="unreliable",outcome="retries_exhausted"}'
        await until_true(lambda: _query(url, zero), timeout=30)  # at 0 before any task
        done = {(await client.publish("summarize", {"text": "A. B."}))[0] for _ in range(20)}
        await watcher.until(lambda: len(watcher.ids_with("completed", done)) == 20 or None, "20")
        failed = {(await client.publish("unreliable", {"n": 1}))[0] for _ in range(5)}
        await watcher.until(lambda: watcher.count("dead_lettered", failed) == 5 or None, "5")
        seen: dict[str, object] = {}
        try:
            async with asyncio.timeout(30):
                while seen.get("ReachSuccessRateLow") not in ("pending", "firing"):
                    await asyncio.sleep(1)
                    seen.update(await _alerts(url))
                    # After the alert: read before it, the ratio could be an evaluation older
                    # than the alert's (NaN, before any task: a loaded CI run).
                    if ratio := await _query(url, "reach:success_ratio:rate5m"):
                        seen["ratio"] = float(ratio[0]["value"][1])
        except TimeoutError:
            raise AssertionError(f"the failures never reached the ratio: {seen}") from None
    assert 0.7 < seen["ratio"] < 0.9  # 20 of 25, whatever rate() extrapolates
