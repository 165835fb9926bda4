"""A cluster as a user meets it: processes connected to different nodes work together, and
`reach up --cluster 3` gives a development cluster in one command."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import pytest

from agentreach import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, EmbeddedCluster
from agentreach.broker.embedded import PID_FILE
from agentreach.broker.errors import EmbeddedServerError
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator import Coordinator
from tests.cli.conftest import reach_command, run
from tests.conftest import FAST

SERVING = re.compile(r"coordinator serving on ([^\s;]+)")


async def test_an_agent_and_the_coordinator_on_different_nodes(tmp_path: Path):
    """The coordinator on n1, the agent on n2 and the caller on n3: a task is routed, run and
    answered across the cluster's routes."""
    agent = Agent("far-away", startup_delay=0)

    @agent.handler("where", capacity=2)
    async def where(ctx: TaskContext, payload: dict) -> dict:
        return {"asked_on": payload["node"]}

    async with (
        EmbeddedCluster(3, store_dir=tmp_path / "cluster") as cluster,
        Broker(cluster.url_of(0), name="coordinator") as on_n1,
        Coordinator(on_n1, FAST).running(),
        Broker(cluster.url_of(1), name="agent") as on_n2,
        agent.running(broker=on_n2),
        ReachClient(cluster.url_of(2), name="caller") as on_n3,
    ):
        result = await on_n3.invoke("where", {"node": "n3"}, execute_deadline_ms=10_000)
        servers = {on_n1.server, on_n2.server, on_n3.broker.server}
    assert result == {"asked_on": "n3"}
    assert len(servers) == 3, servers


async def test_reach_up_cluster_starts_three_nodes_provisions_r3_and_restarts_a_killed_one(
    tmp_path: Path,
):
    """`reach up --cluster 3` starts three nodes on loopback, warns that they are open, says
    the seed list to export, and provisions every stream with three replicas. A node killed
    with `kill -9` is started again on its own (here 0.2 s later), and stopped with the rest:
    nothing is left running."""
    store = tmp_path / "cluster"
    process = await asyncio.create_subprocess_exec(
        reach_command(),
        "up",
        "--cluster",
        "3",
        "--port",
        "-1",
        "--data-dir",
        str(store),
        "--restart-after",
        "0.2",
        "--log-format",
        "json",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "NATS_URL"},
        start_new_session=True,
    )
    assert process.stderr is not None
    lines: list[str] = []

    async def until_logged(pattern: re.Pattern[str]) -> re.Match[str]:
        async with asyncio.timeout(60):
            while not (found := pattern.search("\n".join(lines[-1:]))):
                line = await process.stderr.readline()  # type: ignore[union-attr]
                assert line, "reach up exited:\n" + "\n".join(lines[-20:])
                lines.append(line.decode().rstrip())
        return found

    try:
        serving = await until_logged(SERVING)
        exported = next(line for line in lines if "export NATS_URL=" in line)
        seeds = exported.split("export NATS_URL=")[1].strip()
        provisioned = await run(reach_command(), "provision", "--nats-url", seeds)
        killed = int((store / "n2" / PID_FILE).read_text())
        os.kill(killed, signal.SIGKILL)
        await until_logged(re.compile(r'"event": "nats-server started again".*"node": "n2"'))
        restarted = int((store / "n2" / PID_FILE).read_text())
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)
    assert serving.group(1) == seeds and len(seeds.split(",")) == 3
    assert any("development server: no authentication" in line for line in lines)
    assert provisioned.returncode == 0, provisioned.stderr
    head, *rows = provisioned.stdout.splitlines()
    assert head.startswith("replicas: auto → 3;")
    assert {tuple(row.split()[1:3]) for row in rows} == {("unchanged", "R3")}
    [ended] = [line for line in lines if "nats-server ended" in line]
    assert '"how": "killed by SIGKILL"' in ended
    assert restarted != killed
    with pytest.raises(ProcessLookupError):  # stopped with the others
        os.kill(restarted, 0)
    assert process.returncode in (0, -signal.SIGTERM)


async def test_a_second_cluster_on_the_same_stores_leaves_the_running_one_whole(tmp_path: Path):
    """A second cluster on the stores of a running one (free ports of its own) is refused
    before it writes anything; a node of the running one killed afterwards is started again
    by the supervisor on its own ports, and rejoins the others."""
    store = tmp_path / "cluster"
    async with EmbeddedCluster(3, store_dir=store) as cluster:
        configs = {path: path.read_text() for path in store.glob("n*/nats-server.conf")}
        with pytest.raises(EmbeddedServerError, match="is in use by"):
            async with EmbeddedCluster(3, store_dir=store):
                pass
        assert {path: path.read_text() for path in configs} == configs
        keeping = asyncio.create_task(cluster.keep_up(0.1))
        try:
            killed = int((store / "n2" / PID_FILE).read_text())
            os.kill(killed, signal.SIGKILL)
            async with asyncio.timeout(30):
                while _pid_on(store / "n2") in (None, killed):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # polling: no event says "started again"
            await cluster.wait_healthy()  # n2 on its monitoring port, a current peer again
            async with Broker(cluster.url_of(1)) as on_n2:
                assert on_n2.server == cluster.url_of(1).removeprefix("nats://")
        finally:
            await cancel_and_wait(keeping)


def _pid_on(store: Path) -> int | None:
    """The nats-server started on ``store``, or None between two of them."""
    try:
        return int((store / PID_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
