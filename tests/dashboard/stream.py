"""Reading the dashboard's event stream in tests, as a browser's EventSource would."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from agentreach.coordinator.observability import HttpServer
from tests.dashboard.token import BEARER


@contextlib.asynccontextmanager
async def event_stream(server: HttpServer) -> AsyncIterator[EventStream]:
    """``GET /api/events`` on ``server`` with the tests' token, open for the block."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    head = f"Host: 127.0.0.1:{server.port}\r\n{BEARER}\r\n"
    writer.write(f"GET /api/events HTTP/1.1\r\n{head}\r\n".encode())
    await writer.drain()
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head
        yield EventStream(reader)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


class EventStream:
    """The events of one connection, ``(name, data)`` each, in order."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._buffer = b""  # bytes: a chunk may end inside a character

    async def next(self, timeout: float = 10.0) -> tuple[str, Any]:
        """The next event (a comment or ``retry:`` alone is none)."""
        while True:
            if b"\n\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n\n", 1)
                lines = raw.decode().splitlines()
                fields = dict(line.split(": ", 1) for line in lines if ": " in line)
                if "event" in fields:
                    return fields["event"], json.loads(fields["data"])
                continue
            chunk = await asyncio.wait_for(self._reader.read(1 << 16), timeout)
            if not chunk:
                raise EOFError("the dashboard closed its event stream")
            self._buffer += chunk

    async def during(self, seconds: float) -> list[tuple[str, Any]]:
        """Every event sent in the next ``seconds``."""
        found: list[tuple[str, Any]] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    found.append(await self.next(timeout=seconds + 1))
        return found

    async def until(self, name: str, check: Any, timeout: float = 20.0) -> Any:
        """The data of the first ``name`` event for which ``check(data)`` holds."""
        async with asyncio.timeout(timeout):
            while True:
                got, data = await self.next(timeout=timeout)
                if got == name and check(data):
                    return data
