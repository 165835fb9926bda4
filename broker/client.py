"""The nats-py client every Broker connects with, with its per-message costs cut.

Every JetStream message carries headers (a deduplication id, a trace id, the server's own
on a direct get), and nats-py parses each header block line by line, checking every
character of every name for white space with a generator: on a no-op task, whose
messages each carry three to six headers, that was about a twentieth of the Python time
of one call. :class:`Client` parses the same block to the same result, without the
generator.

It also connects over :class:`agentreach.broker.transport.Transport`, whose failed TLS
upgrade does not hang the connect, and remembers the server it tries (``trying``), so that
a failed connect can name it. And it does not fall back to plain text when TLS was asked for
(a ``tls://`` URL, a CA or a client certificate) and the server offers none: nats-py upgrades
only when the server requires TLS, so a server without it, or one in between that strips it
from its INFO, got the credentials in the clear.

And a message that waits for an answer (a JetStream write, a request, a read) is never sent
after its sender gave up on it. nats-py keeps what it could not send and sends it once the
connection is back: in a chaos run, a coordinator's dispatch that had timed out went out 17 s
later and ran a task a second time. While disconnected, such a publish waits for the
connection (up to its own timeout, or ``answer_wait_s``), then fails with a timeout, sending
nothing; those still buffered when the connection broke are dropped (their senders time out
and write again, under the same ``Nats-Msg-Id``). Messages that wait for nothing
(acknowledgements, replies) are buffered as nats-py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from urllib.parse import ParseResult

import nats.errors
from nats.aio.client import DEFAULT_BUFFER_SIZE
from nats.aio.client import Client as _NatsClient
from nats.aio.msg import Msg

from agentreach.broker.transport import Transport
from agentreach.envelopes.server_answers import DIRECT_GET_ADDS, STORED_ANSWER
from agentreach.logs import get_logger

log = get_logger("broker")

_CRLF = b"\r\n"
_ADDED_ALL = frozenset(DIRECT_GET_ADDS)
ANSWER_WAIT_S = 5.0  # the Broker's request timeout
# Between losing the connection and starting to reconnect, a waiting publish looks again
# this often (a reconnect under way wakes it when it ends).
RECONNECT_POLL_S = 0.02
CANCELS_UNTIL_ENDED = 100  # 0.05 s apart: a swallowed cancellation is a rare race


class Client(_NatsClient):
    """nats-py's client, parsing headers as it does, faster."""

    trying: ParseResult | None = None  # the server of the current connect attempt
    tcp_taken = False  # and whether it took the attempt's connection
    answer_wait_s = ANSWER_WAIT_S
    _reconnected: asyncio.Event | None = None  # clear while a reconnect runs
    _given_up = False  # closed by its owner (not between nats-py's own attempts)

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        if reply and not self.is_connected:
            await self.connected_within(self.answer_wait_s)
        await super().publish(subject, payload, reply, headers)

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Msg:
        if not self.is_connected:  # on the request's clock, not answer_wait_s
            await self.connected_within(timeout)
        return await super().request(subject, payload, timeout, old_style, headers)

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        """nats-py's connect, closed when it fails or its caller gives up on it.

        nats-py leaves a failed connect's socket open. And it awaits each step of a connect
        with ``wait_for``, which on Python 3.11 swallows a cancellation that lands as the
        step completes: the connect went on, and a service told to stop while it waited for
        NATS carried on. Here the caller's cancellation is taken at once, and the connect is
        cancelled until it ends before it is closed."""
        attempt = asyncio.ensure_future(super().connect(*args, **kwargs))
        try:
            await asyncio.wait({attempt})  # never swallows the caller's cancellation
            attempt.result()
        except BaseException:
            await _ended(attempt)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.close(), self.options.get("connect_timeout", 2))
            raise

    async def connected_within(self, within_s: float) -> None:
        """Once the connection is up; raises nats-py's TimeoutError when it is not within
        ``within_s``, and ConnectionClosedError once it is closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while not self.is_connected:
            if self.is_closed:
                raise nats.errors.ConnectionClosedError
            if (left := deadline - loop.time()) <= 0:
                raise nats.errors.TimeoutError
            reconnected = self._reconnected
            if reconnected is None or reconnected.is_set():  # not started yet
                await asyncio.sleep(min(left, RECONNECT_POLL_S))
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await reconnected.wait()

    async def _attempt_reconnect(self) -> None:
        kept = [command for command in self._pending if not _awaits_answer(command)]
        self._pending, self._pending_data_size = kept, sum(map(len, kept))
        reconnected = self._reconnected = self._reconnected or asyncio.Event()
        reconnected.clear()
        try:
            await super()._attempt_reconnect()
        finally:  # back, closed or given up: either way nobody waits for it any longer
            reconnected.set()

    async def close(self) -> None:
        self._given_up = True
        await super().close()

    async def _connect_to_server(self, s: Any) -> None:
        self._stop_if_given_up()
        self.trying, self.tcp_taken = s.uri, False
        if s.uri.scheme in ("ws", "wss"):
            await super()._connect_to_server(s)
        else:  # nats-py's own steps for TCP, with our transport (it would make its own)
            s.last_attempt = time.monotonic()
            if not self._transport:
                self._transport = Transport()
            await self._transport.connect(
                s.uri,
                buffer_size=DEFAULT_BUFFER_SIZE,
                connect_timeout=self.options["connect_timeout"],
            )
        self.tcp_taken = True
        self._stop_if_given_up()

    def _stop_if_given_up(self) -> None:
        """End a connect or reconnect loop still running after its client was closed.

        Closing cancels the reconnect loop, but a cancellation that lands as the TCP connect
        completes is swallowed (see connect): the loop carried on, connecting for ever with
        nobody to close what it opened (a closed Broker's reconnects went on into later
        tests). Cancelled here, it stops, as it does on any other cancellation."""
        if self._given_up:
            if self._transport is not None:
                self._transport.close()
            raise asyncio.CancelledError

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        tls_wanted = "tls" in self.options and not self.options["tls_handshake_first"]
        if initial_connection and tls_wanted and not info.get("tls_required"):
            if not info.get("tls_available"):
                raise TlsNotOffered(
                    "TLS was asked for (a tls:// URL, a CA or a client certificate) but the"
                    " server offers none; refusing to go on in plain text (check the URL,"
                    " or the server's tls block)"
                )
            info["tls_required"] = True  # the server allows it: nats-py upgrades now
        if initial_connection and not info.get("jetstream"):
            # Said once at connecting: every JetStream call after it only times out, and
            # "waiting for JetStream" read as a cluster electing a leader (an outside trial).
            log.warning(
                "this NATS server runs without JetStream, which Agent-Reach needs: start it"
                " with -js, or a jetstream block in its config (a cluster's other nodes may"
                " still answer for it)",
                server=info.get("server_name"),
                port=info.get("port"),
            )
        await super()._process_info(info, initial_connection)

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        """nats-py writes the PING straight to the socket, ahead of what is still buffered:
        a ``flush()`` just after a ``subscribe()`` got its PONG before the server had the
        SUB, and a peer's publish then missed the subscription (1 time in 20). What is
        buffered goes out first, as the flusher sends it."""
        if self._pending and self.is_connected:
            self._transport.writelines(self._pending[:])
            self._pending = []
            self._pending_data_size = 0
        await super()._send_ping(future)

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        """``Name: Value`` per line → a dict, exactly as nats-py 2.16 builds it: lines
        without a colon, names that are not ASCII and names holding white space are
        skipped; values are stripped and decoded as UTF-8 (bad bytes replaced). One thing
        more: a second of the headers a direct get's answer adds (a direct get's answer,
        stored, and read again by a direct get, whose server headers follow the stored ones)
        adds ``STORED_ANSWER``. The server writes the first, ``Nats-Stream``, onto the
        stored block's last line, where a block that does not end as it should hides it
        (``YNats-Stream``, or a value's end); the others it cannot hide."""
        out: dict[str, str] = {}
        for line in raw.split(_CRLF):
            name, colon, value = line.partition(b":")
            if not colon:
                continue
            try:
                key = name.strip().decode("ascii")
            except UnicodeDecodeError:
                continue
            # white space inside: split() gives more parts, or fewer, or other ones
            if key and key.split() != [key]:
                continue
            if key in out and key in _ADDED_ALL:  # see STORED_ANSWER
                stored_in = (v for k, v in out.items() if k.endswith("Nats-Stream"))
                out.setdefault(STORED_ANSWER, next(stored_in, "a stream"))
            out[key] = value.strip().decode("utf-8", "replace")
        return out


def _awaits_answer(command: bytes) -> bool:
    """Whether a buffered command is a publish naming a reply subject:
    ``PUB <subject> <reply> <size>`` or ``HPUB <subject> <reply> <header size> <size>``."""
    verb, _, rest = command[: command.find(_CRLF)].partition(b" ")
    fields = len(rest.split())
    return (verb == b"PUB" and fields == 3) or (verb == b"HPUB" and fields == 4)


class TlsNotOffered(nats.errors.Error):
    """TLS was asked for and the server offers none."""


async def _ended(attempt: asyncio.Future[None]) -> None:
    """Cancel a connect until it ends (a cancellation may be swallowed, see connect)."""
    for _ in range(CANCELS_UNTIL_ENDED):
        if attempt.done():
            break
        attempt.cancel()
        await asyncio.wait({attempt}, timeout=0.05)
    if attempt.done() and not attempt.cancelled():
        attempt.exception()  # raised to the caller already, or moot: retrieved, not logged
