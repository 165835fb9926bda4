"""The issue's "done when", as an operator does it, every part its own process: `reach up`
and the example agents (one fails every task), a real Prometheus on the coordinator's
metrics port where the alert fires, and `reach dashboard` in headless Chromium, which shows
it (screenshot: ``artifacts/operator-day.png``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from tests.e2e.browser import Browser
from tests.e2e.test_dashboard import _artifacts, _browser
from tests.e2e.test_prometheus import RULES, _alerts, _query, prometheus

REACH = Path(sys.executable).parent / "reach"


@contextlib.asynccontextmanager
async def started(*argv: str, wait_for: str, cwd: Path) -> AsyncIterator[re.Match[str]]:
    """Run ``reach ARGV`` until the block ends; yields the first output line matching
    ``wait_for`` (a regular expression), read from stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        str(REACH),
        *argv,
        "--log-format",
        "json",
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        # Its own embedded server, whatever the environment points at.
        env={k: v for k, v in os.environ.items() if k != "NATS_URL"},
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await process.stdout.readline()).decode()
                if not line:
                    raise AssertionError(f"reach {' '.join(argv)} exited:\n{''.join(seen)}")
                seen.append(line)
                if match := re.search(wait_for, line):
                    break
        drain = asyncio.create_task(_drain(process.stdout))
        yield match
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()
        with contextlib.suppress(NameError):
            drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def reach(*argv: str) -> None:
    process = await asyncio.create_subprocess_exec(
        str(REACH), *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    assert await asyncio.wait_for(process.wait(), 30) == 0, argv


async def test_an_operator_sees_the_alert_fire_and_watches_it(tmp_path):
    """reach up + example agents: Prometheus shows the five metrics and fires
    ReachAgentsIsolated for the agent that fails every task; the dashboard shows it."""
    executable = _browser()
    up = started(
        "up",
        "--port",
        "-1",
        "--data-dir",
        str(tmp_path / "nats"),
        "--metrics-port",
        "0",
        wait_for=r"coordinator serving on (nats://\S+); metrics on http://(\S+?)/metrics",
        cwd=tmp_path,
    )
    async with up as serving:
        url, metrics = serving.group(1), serving.group(2)
        agent = ("agent", "--nats-url", url)
        async with (
            started(
                *agent, "agentreach.examples.summarize:agent", wait_for="serving", cwd=tmp_path
            ),
            started(*agent, "agentreach.examples.failing:agent", wait_for="serving", cwd=tmp_path),
            started(
                "dashboard",
                "--nats-url",
                url,
                "--port",
                "0",
                "--step-s",
                "1",
                wait_for=r"dashboard on (http://\S+/\?token=\S+)",  # the URL to open
                cwd=tmp_path,
            ) as dashboard,
            prometheus(metrics, tmp_path) as prom,
        ):
            seen: dict[str, object] = {}
            async with asyncio.timeout(120):
                while not (
                    # a ratio is NaN until both of its rates have two scrapes
                    all(rule in seen and not math.isnan(seen[rule]) for rule in RULES)
                    and (seen.get("alerts") or {}).get("ReachAgentsIsolated") == "firing"
                    # the unreliable tasks' dead letters reach the ratio after their retries
                    and seen["reach:success_ratio:rate5m"] < 0.995
                ):
                    await reach("publish", "summarize", '{"text": "Fast. Yes."}', "--nats-url", url)
                    await reach("publish", "unreliable", '{"n": 1}', "--nats-url", url)
                    for rule in RULES:
                        if result := await _query(prom, rule):
                            seen[rule] = float(result[0]["value"][1])
                    seen["alerts"] = await _alerts(prom)
            shot = _artifacts() / "operator-day.png"

            def look() -> dict:
                with Browser(executable, 1400, 1100) as browser:
                    session = browser.open(dashboard.group(1))
                    facts = browser.wait_for(
                        session,
                        lambda f: (
                            f.get("updates", 0) >= 2
                            and (f.get("metrics") or {}).get("isolated_agents", {}).get("state")
                            == "firing"
                        ),
                        timeout=30,
                    )
                    browser.screenshot(session, shot)
                    return facts

            facts = await asyncio.to_thread(look)
    print(f"\noperator's day screenshot: {shot}")
    assert seen["reach:isolated_agents:max"] == 1
    assert seen["reach:success_ratio:rate5m"] < 0.995
    assert facts["metrics"]["isolated_agents"]["state"] == "firing", facts
    assert {"summarizer-1", "failing-1"} <= set(facts["agents"])
    assert "isolated" in facts["agentText"]["failing-1"]
