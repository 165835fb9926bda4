"""The TCP transport every Broker connects over: nats-py's, with failed attempts closed.

nats-py 2.16 upgrades a plain stream to TLS by handing its socket to ``loop.start_tls``.
When the handshake fails (an untrusted certificate, a plain ``nats://`` URL to a TLS
server) asyncio closes that socket, but the plain stream never hears of it: its
``wait_closed`` waits forever, and with it the connect or reconnect that closes the
failed attempt (nats-io/nats.py#718). Here the failed upgrade forgets the plain stream,
so closing the attempt returns at once and the next one opens a fresh connection.

And nats-py's reconnect loop opens the next attempt over the stream of one that failed after
its TCP connect (no INFO in time from a hung host, a server closing as it answered), never
closing it. Collected later, in an event loop that had closed, it warned "loop is closed" and
left its transport and socket open (a CI run failed on the three warnings). Here each connect
closes what the last attempt left first.
"""

from __future__ import annotations

import ssl
from typing import Any

from nats.aio.transport import TcpTransport


class Transport(TcpTransport):
    """nats-py's TCP transport, which closes the last attempt's stream before the next
    attempt and drops its stream when the TLS upgrade fails."""

    async def connect(self, uri: Any, buffer_size: int, connect_timeout: int) -> None:
        for writer in (self._io_writer, self._bare_io_writer):
            if writer is not None:
                writer.close()  # closed already after a clean disconnect: nothing happens
        self._io_reader = self._bare_io_reader = None
        self._io_writer = self._bare_io_writer = None
        await super().connect(uri, buffer_size, connect_timeout)

    async def connect_tls(
        self, uri: Any, ssl_context: ssl.SSLContext, buffer_size: int, connect_timeout: int
    ) -> None:
        try:
            await super().connect_tls(uri, ssl_context, buffer_size, connect_timeout)
        except BaseException:
            # The socket is closed already (start_tls did it); nothing is left to close.
            self._io_reader = self._bare_io_reader = None
            self._io_writer = self._bare_io_writer = None
            raise
