"""`reach up` as an operator meets it: what it says about the servers it runs."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from agentreach.broker.embedded import PID_FILE
from tests.cli.conftest import reach_command, started_until

ENV = {k: v for k, v in os.environ.items() if k != "NATS_URL"}


async def test_a_server_that_ends_with_restart_after_0_is_said_to_stay_down(tmp_path: Path):
    """With `--restart-after 0`, a killed nats-server is not started again, and reach up says
    so in one line (before, it said nothing at all)."""
    store = tmp_path / "nats"
    process = await started_until(
        reach_command(),
        *("up", "--port", "-1", "--data-dir", store, "--restart-after", "0"),
        *("--metrics-port", "-1", "--log-format", "json"),
        said=b"coordinator serving on",
        env=ENV,
    )
    assert process.stderr is not None
    try:
        os.kill(int((store / PID_FILE).read_text()), signal.SIGKILL)
        async with asyncio.timeout(60):  # a bound for a hang: CI runs two suites at once
            while b"nats-server ended" not in (line := await process.stderr.readline()):
                assert line, "reach up exited"
    finally:
        os.killpg(process.pid, signal.SIGINT)
        await asyncio.wait_for(process.wait(), 30)
    assert b'"event": "nats-server ended; not starting it again"' in line
    assert b"killed by SIGKILL" in line


async def test_a_cluster_of_two_is_warned_to_tolerate_no_failure(tmp_path: Path):
    """`reach up --cluster 2` says once that two nodes ride out no node's loss, and that three
    is the smallest cluster that does."""
    process = await started_until(
        reach_command(),
        *("up", "--cluster", "2", "--port", "-1", "--data-dir", tmp_path / "cluster"),
        *("--metrics-port", "-1", "--log-format", "json"),
        said=b"a cluster of 2 nodes tolerates no node failure",
        env=ENV,
        timeout=60,
    )
    os.killpg(process.pid, signal.SIGINT)
    try:  # what is tested is said above; a stop slowed by a busy machine must not fail it
        await asyncio.wait_for(process.wait(), 30)
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


async def test_cluster_ports_are_refused_where_they_cannot_apply(tmp_path: Path):
    """`--cluster-ports` without `--cluster`, without a client `--port`, or overlapping the
    client ports is refused by name before any server starts."""
    cases = {
        ("--cluster-ports", "37311,37321"): "--cluster-ports is for the nodes of --cluster",
        ("--cluster", "3", "--port", "-1", "--cluster-ports", "37311,37321"): "needs a --port",
        ("--cluster", "3", "--port", "37301", "--cluster-ports", "37302,37321"): "overlap",
        ("--cluster", "3", "--port", "37301", "--cluster-ports", "37311"): "two port numbers",
    }
    for args, said in cases.items():
        process = await asyncio.create_subprocess_exec(
            reach_command(), "up", *args, "--data-dir", str(tmp_path / "c"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV,
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode != 0 and said in err.decode(), (args, err)
    assert not (tmp_path / "c").exists()  # nothing was started
