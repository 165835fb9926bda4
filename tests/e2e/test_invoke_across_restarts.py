"""ReachClient.invoke across a server restart: a result sent while the caller was away is
read from the trace as soon as the caller is back, not at the task's ttl."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names
from agentreach.broker.lifecycle import events_of_id
from agentreach.coordinator import Coordinator
from tests.conftest import FAST
from tests.e2e.test_startup_and_restarts import RestartableServer, free_port
from tests.support import eventually, until_true

INVOKES = 4


class Gate:
    """A TCP relay to a server that a test shuts (the connections through it drop, new ones
    are refused) and opens again: one party kept away while the others are back."""

    def __init__(self, target_port: int) -> None:
        self.port, self._target = free_port(), target_port
        self.url = f"nats://127.0.0.1:{self.port}"
        self._links: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Gate:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shut()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def shut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in self._links:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        self._relays.add(relay)
        links = {writer}
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
            links.add(up_writer)
            self._links |= links
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            self._links -= links
            for link in links:
                link.close()
                with contextlib.suppress(OSError):
                    await link.wait_closed()
            self._relays.discard(relay)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def test_invokes_get_results_sent_while_the_caller_was_away_within_seconds(
    tmp_path: Path,
) -> None:
    """The server restarts while four invokes wait (acknowledged, ttl 120 s); their results
    are sent while the caller is still away, so the replies are lost. Each invoke returns its
    result within a few seconds of the caller being back, and each handler ran once."""
    runs, gate = Counter[str](), asyncio.Event()
    agent = Agent("slowpoke", startup_delay=0, ack_wait=2.0)

    @agent.handler("slow", capacity=INVOKES + 1)  # a P1 task leaves the last place free
    async def slow(ctx: TaskContext, payload: dict) -> dict:
        runs[ctx.message_id] += 1
        await gate.wait()
        return {"n": payload["n"]}

    async with (
        RestartableServer(tmp_path / "nats") as server,
        Gate(server.port) as relay,
        Broker(server.url, names=Names(), name="coordinator", wait=True) as broker,
        Coordinator(broker, FAST).running(),
        agent.running(server.url),
        ReachClient(relay.url) as client,
    ):
        acks: Counter[int] = Counter()
        invokes = [
            asyncio.create_task(
                client.invoke(
                    "slow",
                    {"n": n},
                    ack_deadline_ms=30_000,
                    execute_deadline_ms=60_000,
                    ttl_ms=120_000,
                    on_ack=lambda _, n=n: acks.update([n]),
                )
            )
            for n in range(INVOKES)
        ]
        await eventually(lambda: len(acks) == INVOKES and len(runs) == INVOKES, 30)
        await relay.shut()  # the caller is away from here until the results are sent
        await server.stop()
        gate.set()  # the handlers end while the server is down
        await server.start()

        async def all_completed() -> bool:
            for message_id in runs:
                events = await events_of_id(broker, message_id)
                if not any(e.event == "completed" for e in events):
                    return False
            return True

        await until_true(all_completed, timeout=60, every_s=0.2)
        reconnects = client.broker.reconnects
        await relay.open()
        await eventually(lambda: client.broker.reconnects > reconnects, 15)
        back = asyncio.get_running_loop().time()
        async with asyncio.timeout(10):  # not at the ack deadline (30 s) nor the ttl
            results = await asyncio.gather(*invokes)
        waited_s = asyncio.get_running_loop().time() - back
    assert sorted(r["n"] for r in results) == list(range(INVOKES))
    assert waited_s < 4.0
    assert set(runs.values()) == {1}
