"""Agent-side liveness parts that need no server: identity, jitter, the watchdog."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time

import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, AgentConfigError
from agentreach.agents.heartbeats import jittered
from agentreach.agents.watchdog import Watchdog
from tests.support import stopped


def test_generated_identity_is_kept_across_restarts(tmp_path):
    """Without an explicit id, one is generated once and read back on every start."""
    identity = tmp_path / "state" / "agent-id"
    first = Agent(identity_file=identity)
    second = Agent(identity_file=identity)
    assert first.agent_id == second.agent_id
    assert first.agent_id.startswith("agent-")
    assert identity.read_text().strip() == first.agent_id
    assert Agent("explicit", identity_file=identity).agent_id == "explicit"


def test_unwritable_identity_file_is_a_config_error(tmp_path):
    """An identity file that cannot be used names itself."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AgentConfigError, match=r"identity file .*agent-id"):
        Agent(identity_file=blocker / "agent-id")


def test_heartbeat_jitter_stays_within_twenty_percent():
    """Intervals spread over ±20 % so a fleet does not beat in step."""
    rng = random.Random(3)
    beats = [jittered(15.0, rng) for _ in range(1000)]
    assert 12.0 <= min(beats) < 12.5 and 17.5 < max(beats) <= 18.0


async def test_watchdog_reports_a_held_loop_with_its_stack():
    """Blocking the loop past the threshold logs 'heartbeat lag detected' with the culprit."""
    # 0.5 s, not 0.1: on a loaded CI machine the watchdog's own thread woke more than 0.1 s
    # late, took that for the whole process stopped, and said nothing of the held loop.
    watchdog = Watchdog(threshold_s=0.5)
    with capture_logs() as logs:
        runner = asyncio.create_task(watchdog.run())
        # Turns of the loop for a while first: a busy machine's own stall of the loop (one
        # CI run had it) is over, and seen over, before this one holds it.
        await asyncio.sleep(0.6)
        time.sleep(1.2)  # noqa: ASYNC251 - holding the loop is what is under test
        await asyncio.sleep(0.2)
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    lags = [entry for entry in logs if entry["event"] == "heartbeat lag detected"]
    held = [e for e in lags if "test_watchdog_reports_a_held_loop_with_its_stack" in e["stack"]]
    assert len(held) == 1, lags
    assert watchdog.lags_detected == len(lags)


WATCHED = """
import asyncio, json
from structlog.testing import capture_logs
from agentreach.agents.watchdog import Watchdog

async def main():
    watchdog = Watchdog(threshold_s=0.3)
    with capture_logs() as logs:
        runner = asyncio.create_task(watchdog.run())
        print("ready", flush=True)
        await asyncio.sleep(3)
        runner.cancel()
    print(json.dumps([e for e in logs if e["event"].startswith("heartbeat lag")]), flush=True)

asyncio.run(main())
"""


async def test_watchdog_says_the_whole_process_was_stopped_not_the_loop():
    """A SIGSTOP of the agent (a re-trial) was logged as a held loop, with a stack that
    blamed nats-py's ping: the watchdog's own thread stood still as long, so it says the
    whole process was stopped, with no stack."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WATCHED, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    assert await asyncio.wait_for(child.stdout.readline(), 20) == b"ready\n"
    await asyncio.sleep(0.5)  # the watchdog's thread runs, stamped by the loop
    await stopped(child.pid)
    await asyncio.sleep(1.0)  # the pause itself
    os.kill(child.pid, signal.SIGCONT)
    said = json.loads(await asyncio.wait_for(child.stdout.readline(), 20))
    await child.wait()
    assert [e["event"] for e in said] == ["heartbeat lag: the whole process was stopped"], said
    assert "stack" not in said[0] and said[0]["stopped_s"] >= 1.0
