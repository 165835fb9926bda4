"""A small HTTP/1.1 server on asyncio streams, for ``/metrics``, health and the dashboard.

It serves a handful of routes to Prometheus, probes and one browser page, so a web
framework would bring more than it gives: requests are read with a size limit and a
timeout, each answered once (``Connection: close``), or kept open for server-sent events.
It runs on the coordinator's event loop, so handlers read the views without locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

import structlog

from agentreach.errors import ReachError

log = structlog.get_logger("coordinator.http")

MAX_HEAD = 16_384
MAX_BODY = 65_536
READ_TIMEOUT_S = 10.0
# A port in use is waited for this long, tried this often: a process stopping drains first.
PORT_WAIT_S = 15.0
PORT_RETRY_S = 0.5
REASONS = {
    200: "OK",
    202: "Accepted",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    421: "Misdirected Request",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HttpError(ReachError):
    """The HTTP server could not start (its port is taken, say)."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    body: bytes = b""
    local: tuple[str, int] | None = None  # the address and port it came in on

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else {}


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_json(cls, value: Any, status: int = 200) -> Response:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(status, data, "application/json")

    @classmethod
    def error(cls, status: int, message: str) -> Response:
        return cls.of_json({"error": message}, status)


@dataclass
class Streamed:
    """A response sent as the chunks come (server-sent events), until they end."""

    chunks: AsyncIterator[bytes]
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response | Streamed]]


class HttpServer:
    """Serves ``handler`` on ``host:port`` for the duration of the block (port 0: any free
    one; :attr:`port` says which). With ``any_port_if_taken``, a port in use is a preference
    given up for any free one (said in the log), decided when binding, not before."""

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        any_port_if_taken: bool = False,
    ) -> None:
        self._handler = handler
        self.host = host
        self.port = port
        self._any_port_if_taken = any_port_if_taken
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._closing = False

    async def __aenter__(self) -> Self:
        try:
            self._server = await self._listen_when_free(self.port)
        except OSError as exc:
            if not (self._any_port_if_taken and exc.errno == errno.EADDRINUSE):
                where = f"{self.host}:{self.port}"
                raise HttpError(f"cannot listen on {where}: {exc.strerror}") from None
            wanted = self.port
            self._server = await self._listen(0)
            log.warning("port taken (another replica?); serving on a free one", wanted=wanted)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _listen(self, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._serve, self.host, port)

    async def _listen_when_free(self, port: int) -> asyncio.Server:
        """Listen on ``port``; one in use is waited for up to ``PORT_WAIT_S`` when it is
        demanded: the process restarted in its place may still be draining (a coordinator
        started again at once after SIGTERM exited "address already in use")."""
        waited_s = 0.0
        while True:
            try:
                return await self._listen(port)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or self._any_port_if_taken or not port:
                    raise
                if waited_s >= PORT_WAIT_S:
                    raise
                if not waited_s:
                    why = "port in use; waiting for it (the process before still stopping?)"
                    log.warning(why, port=port, up_to_s=PORT_WAIT_S)
            await asyncio.sleep(PORT_RETRY_S)
            waited_s += PORT_RETRY_S

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for client in list(self._clients):  # open event streams end with the server
            client.cancel()
        if self._clients:
            await asyncio.wait(self._clients, timeout=2)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._closing:  # accepted as the server closed: its task started after the cancels
            writer.close()
            return
        self._clients.add(task)
        try:
            await self._answer(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or never finished its request
        except asyncio.CancelledError:
            pass  # the server is closing
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        local = writer.get_extra_info("sockname")
        try:
            request = await asyncio.wait_for(
                _read_request(reader, (local[0], local[1]) if local else None), READ_TIMEOUT_S
            )
        except _BadRequest as exc:
            await _write(writer, Response.error(exc.status, str(exc)))
            return
        try:
            response = await self._handler(request)
        except Exception:  # a bug in a handler answers 500, and the server goes on
            log.exception("http handler failed", path=request.path)
            response = Response.error(500, "internal error; see the server's log")
        if isinstance(response, Streamed):
            await _stream(writer, response)
        else:
            await _write(writer, response, head_only=request.method == "HEAD")


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _read_request(
    reader: asyncio.StreamReader, local: tuple[str, int] | None = None
) -> Request:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise _BadRequest(413, "request head too large") from None
    if len(head) > MAX_HEAD:
        raise _BadRequest(413, "request head too large")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError:
        raise _BadRequest(400, "malformed request line") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "host" and name in headers:  # which one a proxy read, nobody knows
                raise _BadRequest(400, "more than one Host header")
            headers[name] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise _BadRequest(413, "request body too large")
    body = await reader.readexactly(length) if length else b""
    url = urlsplit(target)
    return Request(method.upper(), unquote(url.path), parse_qs(url.query), headers, body, local)


async def _write(writer: asyncio.StreamWriter, response: Response, head_only: bool = False) -> None:
    headers = {
        "Content-Type": response.content_type,
        "Content-Length": str(len(response.body)),
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Connection": "close",
        **response.headers,
    }
    writer.write(_head(response.status, headers) + (b"" if head_only else response.body))
    await writer.drain()


async def _stream(writer: asyncio.StreamWriter, response: Streamed) -> None:
    headers = {
        "Content-Type": response.content_type,
        "Cache-Control": "no-store",
        "X-Accel-Buffering": "no",  # proxies must pass events on at once
        "Connection": "close",
        **response.headers,
    }
    writer.write(_head(200, headers))
    await writer.drain()
    try:
        async for chunk in response.chunks:
            writer.write(chunk)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            await response.chunks.aclose()  # type: ignore[attr-defined]


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
