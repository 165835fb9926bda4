"""Start-up order and server restarts: nothing exits, no result is lost, nothing runs twice."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from pathlib import Path

from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, BrokerTimeout, EmbeddedServer, Names, wait_provisioned
from agentreach.coordinator import Coordinator
from agentreach.coordinator.workflows import WorkflowEngine
from tests.conftest import FAST
from tests.support import wait_for_card


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RestartableServer:
    """An embedded nats-server on one port and store that a test stops and starts again."""

    def __init__(self, store: Path) -> None:
        self.port, self._store = free_port(), store
        self.url = f"nats://127.0.0.1:{self.port}"
        self._server: EmbeddedServer | None = None

    async def start(self) -> None:
        self._server = EmbeddedServer(port=self.port, store_dir=self._store)
        await self._server.__aenter__()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()

    async def kill(self) -> None:
        """SIGKILL: what the server had not written to its store yet is lost (its consumers'
        latest acknowledgements, say)."""
        if self._server is not None:
            await self._server.kill()

    async def __aenter__(self) -> RestartableServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def counting_agent(agent_id: str, runs: Counter[str], gate: asyncio.Event | None = None) -> Agent:
    agent = Agent(agent_id, startup_delay=0, ack_wait=2.0)

    @agent.handler("count")
    async def count(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        if gate is not None:
            await gate.wait()
        return {"n": payload.get("n", 0)}

    return agent


async def test_agent_and_coordinator_wait_for_a_server_that_is_not_up_yet(tmp_path: Path):
    """Both started before nats-server: they wait (saying so), then serve once it is up."""
    port, runs = free_port(), Counter[str]()
    url = f"nats://127.0.0.1:{port}"
    with capture_logs() as logs:
        agent = asyncio.create_task(counting_agent("early-bird", runs).run(url))
        coordinator = asyncio.create_task(_coordinate(url))
        await asyncio.sleep(2.5)  # the server is down on purpose for this long
        assert not agent.done() and not coordinator.done()
        async with EmbeddedServer(port=port, store_dir=tmp_path / "nats"):
            async with ReachClient(url) as client:
                names = client.broker.names
                await wait_provisioned(client.broker, streams=[], buckets=[names.agents_bucket])
                await wait_for_card(client.broker, "early-bird", status="running", timeout=30)
                result = await client.invoke("count", {"n": 7}, ack_deadline_ms=20_000)
            agent.cancel()
            coordinator.cancel()
            await asyncio.gather(agent, coordinator, return_exceptions=True)
    assert result == {"n": 7}
    waits = [e for e in logs if e["event"] == "waiting for NATS"]
    assert waits and all(e["url"] == url for e in waits)


async def _coordinate(url: str) -> None:
    async with (
        Broker(url, name="coordinator", wait=True) as broker,
        Coordinator(broker, FAST).running(),
    ):
        await asyncio.Event().wait()


async def test_agent_on_an_unprovisioned_server_waits_for_the_coordinator(nats_url, names):
    """An agent first on a fresh server waits for the streams; it serves once they exist."""
    runs: Counter[str] = Counter()
    with capture_logs() as logs:
        agent = asyncio.create_task(counting_agent("first", runs).run(nats_url))
        await asyncio.sleep(1.0)  # no coordinator yet, on purpose
        assert not agent.done()
        async with (
            Broker(nats_url, names=names, name="coordinator") as broker,
            Coordinator(broker, FAST).running(),
            ReachClient(broker=broker) as client,
        ):
            await wait_for_card(broker, "first", status="running", timeout=30)
            result = await client.invoke("count", {"n": 1}, ack_deadline_ms=20_000)
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
    assert result == {"n": 1}
    missing = [e for e in logs if e["event"].startswith("waiting for the streams and buckets")]
    assert missing and names.agents_bucket in missing[0]["missing"]


async def test_a_result_survives_a_server_restart_and_runs_once(tmp_path: Path):
    """The server goes away while the handler runs: its result is kept, recorded once the
    server is back, and the redelivery is answered from it instead of a second run."""
    runs, gate = Counter[str](), asyncio.Event()
    async with RestartableServer(tmp_path / "nats") as server:
        url = server.url
        async with (
            Broker(url, names=Names(), name="coordinator", wait=True) as broker,
            Coordinator(broker, FAST).running(),
            counting_agent("steady", runs, gate).running(url),
            ReachClient(url) as client,
        ):
            message_id, _ = await client.publish("count", {"n": 3}, ttl_ms=120_000)
            await _until(lambda: runs[message_id] == 1)
            await server.stop()  # the handler finishes while the server is down
            gate.set()
            await asyncio.sleep(9)  # longer than the agent keeps retrying the record write
            await server.start()
            completed = await _completed(client, message_id)
    assert runs[message_id] == 1
    assert completed


async def _until(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def _completed(client: ReachClient, message_id: str, timeout: float = 60.0) -> bool:
    """Until the message has its ``completed`` event (read back from the stream)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                events = await client.status(message_id)
            except Exception:
                events = []
            if any(e.event == "completed" for e in events):
                return True
            await asyncio.sleep(0.2)


async def test_progress_during_a_server_restart_does_not_fail_the_handler(tmp_path: Path):
    """A handler reports progress while the server is away: the report is lost, not the
    work. It used to raise BrokerTimeout into the handler, whose step then ran again."""
    runs, gate = Counter[str](), asyncio.Event()
    raised: list[BaseException] = []
    agent = Agent("reporter", startup_delay=0, ack_wait=2.0)

    @agent.handler("report")
    async def report(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        await gate.wait()
        try:
            await ctx.progress("still working")
        except BaseException as exc:
            raised.append(exc)
            raise
        return {"reported": True}

    async with RestartableServer(tmp_path / "nats") as server:
        url = server.url
        async with (
            Broker(url, names=Names(), name="coordinator", wait=True) as broker,
            Coordinator(broker, FAST).running(),
            agent.running(url),
            ReachClient(url) as client,
        ):
            message_id, _ = await client.publish("report", {}, ttl_ms=120_000)
            await _until(lambda: runs[message_id] == 1)
            await server.stop()
            with capture_logs() as logs:
                gate.set()
                said = ("progress not reported", "progress not reported yet; the handler goes on")
                await _until(lambda: any(e["event"] in said for e in logs))
            await server.start()
            completed = await _completed(client, message_id)
    assert raised == []
    assert runs[message_id] == 1
    assert completed


async def test_a_start_waits_for_the_workflow_records_as_for_its_consumers(
    broker, monkeypatch
) -> None:
    """Restarted after a flood, a coordinator whose read of the workflow records timed out
    exited (and `reach up` took its server down with it: an outside re-test). It asks again,
    saying so, as it does for its consumers, and then serves."""
    calls = 0
    resume_all = WorkflowEngine.resume_all

    async def slow_at_first(self: WorkflowEngine) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise BrokerTimeout("timed out on 'KV_reach_workflows'")
        return await resume_all(self)

    monkeypatch.setattr(WorkflowEngine, "resume_all", slow_at_first)
    with capture_logs() as logs:
        async with (
            Broker(broker.url, names=broker.names, name="coordinator") as own,
            Coordinator(own, FAST).running() as coordinator,
        ):
            assert coordinator.readiness.serving
    assert calls == 2
    assert any("the workflow records" in str(e.get("waiting_for", e)) for e in logs), logs
