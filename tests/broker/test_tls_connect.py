"""A TLS trust mistake (a plain URL to a TLS server, no CA, the wrong CA) fails the first
connect within seconds, saying which certificate problem and what to check; it hung."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentreach.broker import Auth, Broker, EmbeddedServer, TlsFailed
from tests.certificates import certificate_authority, server_certificate
from tests.cli.conftest import reach_command, run

FAILS_WITHIN_S = 8.0


@dataclass(frozen=True)
class TlsServer:
    port: int
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that did not


@contextlib.asynccontextmanager
async def _tls_server(tmp_path: Path, *, also_plain: bool = False) -> AsyncIterator[TlsServer]:
    ca = certificate_authority(tmp_path / "tls", "ca")
    other_ca = certificate_authority(tmp_path / "tls", "other-ca")
    cert, key = server_certificate(tmp_path / "tls", ca)
    config = tmp_path / "tls.conf"
    config.write_text(
        f'listen: "127.0.0.1:-1"\njetstream {{ store_dir: "{tmp_path / "store"}" }}\n'
        f'tls {{ cert_file: "{cert}", key_file: "{key}" }}\n'
        + ("allow_non_tls: true\n" if also_plain else "")
    )
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "store", config=config) as server:
        port = int(server.url.rsplit(":", 1)[1])
        yield TlsServer(port=port, ca=ca, other_ca=other_ca)


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[TlsServer]:
    """A nats-server on loopback that requires TLS, its certificate from a throwaway CA."""
    async with _tls_server(tmp_path) as server:
        yield server


async def _refused(url: str, auth: Auth) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(TlsFailed) as failed:
        async with Broker(url, auth=auth):
            pass
    return str(failed.value), time.monotonic() - started


async def test_a_plain_url_to_a_tls_server_says_to_use_tls(tls_server):
    """nats:// to a server that requires TLS: the certificate is not trusted; use tls://."""
    said, took_s = await _refused(f"nats://127.0.0.1:{tls_server.port}", Auth())
    assert took_s < FAILS_WITHIN_S
    assert "certificate is not trusted" in said, said
    assert "--tls-ca" in said and "use a tls:// URL" in said, said


async def test_tls_without_a_ca_says_to_pass_one(tls_server):
    """tls:// without --tls-ca: the system's CAs do not trust the certificate; pass one."""
    said, took_s = await _refused(f"tls://127.0.0.1:{tls_server.port}", Auth())
    assert took_s < FAILS_WITHIN_S
    assert f"cannot connect to NATS at tls://127.0.0.1:{tls_server.port}" in said, said
    assert "pass --tls-ca" in said and "tls:// URL" not in said, said


async def test_the_wrong_ca_is_named(tls_server):
    """A CA that did not sign the server's certificate is named as the one to check."""
    auth = Auth(tls_ca=tls_server.other_ca)
    said, took_s = await _refused(f"tls://127.0.0.1:{tls_server.port}", auth)
    assert took_s < FAILS_WITHIN_S
    assert f"--tls-ca {tls_server.other_ca} is not the CA that signed" in said, said


async def test_the_right_ca_connects(tls_server):
    """With the CA that signed it, the same server is connected to (by tls:// or nats://)."""
    for scheme in ("tls", "nats"):
        async with Broker(
            f"{scheme}://127.0.0.1:{tls_server.port}", auth=Auth(tls_ca=tls_server.ca)
        ) as broker:
            assert broker.connected


async def test_reach_says_the_certificate_problem_and_exits(tls_server):
    """`reach agents` at a TLS server without its CA exits 1 in seconds with one line."""
    started = time.monotonic()
    done = await run(
        reach_command(), "agents", "--nats-url", f"tls://127.0.0.1:{tls_server.port}",
        timeout=FAILS_WITHIN_S,
    )  # fmt: skip
    assert time.monotonic() - started < FAILS_WITHIN_S
    assert done.returncode == 1, done
    assert "certificate is not trusted" in done.stderr and "--tls-ca" in done.stderr, done.stderr


def _encrypted(broker: Broker) -> bool:
    return broker.nc._transport._io_writer.get_extra_info("ssl_object") is not None  # type: ignore[union-attr]


async def test_tls_asked_of_a_server_without_it_is_refused_not_sent_in_plain_text(
    nats_url, tmp_path
):
    """tls://, or a CA, to a server that offers no TLS (or a man in the middle that strips it
    from the server's INFO): nats-py went on in plain text, credentials and all."""
    port = nats_url.rsplit(":", 1)[1]
    with_ca = Auth(tls_ca=certificate_authority(tmp_path, "ca"))
    for url, auth in ((f"tls://127.0.0.1:{port}", Auth()), (f"nats://127.0.0.1:{port}", with_ca)):
        said, took_s = await _refused(url, auth)
        assert took_s < FAILS_WITHIN_S
        assert "the server offers none; refusing to go on in plain text" in said, said


async def test_a_server_that_allows_tls_is_connected_to_over_tls(tmp_path):
    """A server that takes TLS and plain text alike (allow_non_tls): TLS when asked for."""
    async with _tls_server(tmp_path, also_plain=True) as server:
        url = f"tls://127.0.0.1:{server.port}"
        async with Broker(url, auth=Auth(tls_ca=server.ca)) as broker:
            assert _encrypted(broker)
        async with Broker(f"nats://127.0.0.1:{server.port}", auth=Auth()) as broker:
            assert not _encrypted(broker)  # nobody asked
