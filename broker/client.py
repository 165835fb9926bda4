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
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import ParseResult

import nats.errors
from nats.aio.client import DEFAULT_BUFFER_SIZE
from nats.aio.client import Client as _NatsClient

from agentreach.broker.transport import Transport
from agentreach.envelopes.server_answers import DIRECT_GET_ADDS, STORED_ANSWER

_CRLF = b"\r\n"
_ADDED_ALL = frozenset(DIRECT_GET_ADDS)


class Client(_NatsClient):
    """nats-py's client, parsing headers as it does, faster."""

    trying: ParseResult | None = None  # the server of the current connect attempt

    async def _connect_to_server(self, s: Any) -> None:
        self.trying = s.uri
        if s.uri.scheme in ("ws", "wss"):
            await super()._connect_to_server(s)
            return
        # nats-py's own steps for TCP, with our transport (it would make its own).
        s.last_attempt = time.monotonic()
        if not self._transport:
            self._transport = Transport()
        await self._transport.connect(
            s.uri, buffer_size=DEFAULT_BUFFER_SIZE, connect_timeout=self.options["connect_timeout"]
        )

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


class TlsNotOffered(nats.errors.Error):
    """TLS was asked for and the server offers none."""
