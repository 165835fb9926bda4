"""The embedded nats-server: what a process that dies without stopping it leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from agentreach.broker import Broker, EmbeddedServer
from agentreach.broker.embedded import PID_FILE, find_server_binary
from agentreach.broker.errors import EmbeddedServerError
from agentreach.broker.ports import ephemeral_low, free_ports
from tests.support import until_true

# A `reach up` killed with -9 while its embedded server runs.
KILLED_WHILE_SERVING = """
import asyncio, os, sys
from agentreach.broker import EmbeddedServer

async def main():
    async with EmbeddedServer(port=-1, store_dir=sys.argv[1]) as server:
        print(server.url, flush=True)
        os.kill(os.getpid(), 9)

asyncio.run(main())
"""


async def test_a_server_whose_starter_is_killed_stops_with_it(tmp_path):
    """A `reach up` killed with -9 left its servers running, no longer reading their stderr:
    each died of SIGPIPE at its next log line, and one node's death took the rest of a
    cluster (a walkthrough). A server stops with the process that started it."""
    store = tmp_path / "store"
    killed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED_WHILE_SERVING, str(store), stdout=asyncio.subprocess.PIPE
    )
    assert killed.stdout is not None
    url = ""
    while not url.startswith("nats://"):  # after the server's own log line
        url = (await asyncio.wait_for(killed.stdout.readline(), 20)).decode().strip()
    await killed.wait()
    orphan = int((store / PID_FILE).read_text())
    try:
        await until_true(lambda: _gone(orphan), timeout=10)
        # Its store is free for the next server (on any port: once freed, the orphan's was
        # taken by another test's server on a loaded CI run).
        async with EmbeddedServer(port=-1, store_dir=store) as server, Broker(server.url) as b:
            await b.flush()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)


async def test_a_server_left_on_a_store_is_stopped_before_the_store_is_used(tmp_path):
    """A nats-server left running on the store (started by hand, or by a release before
    servers stopped with their starter) holds its port and store: it is stopped first."""
    store = tmp_path / "store"
    store.mkdir()
    port = _free_port()
    args = ["-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    left = await asyncio.create_subprocess_exec(
        str(find_server_binary()), *args, stderr=asyncio.subprocess.DEVNULL
    )
    (store / PID_FILE).write_text(f"{left.pid}\n")
    try:
        url = f"nats://127.0.0.1:{port}"
        await until_true(lambda: _serves(url), timeout=10)
        async with EmbeddedServer(port=port, store_dir=store) as server, Broker(server.url) as b:
            await b.flush()
            assert int((store / PID_FILE).read_text()) != left.pid
        assert await asyncio.wait_for(left.wait(), 5) is not None
        assert not (store / PID_FILE).exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            left.kill()


async def _gone(pid: int) -> bool:
    return not _alive(pid)


async def _serves(url: str) -> bool:
    try:
        async with Broker(url, connect_timeout=1) as broker:
            await broker.flush()
    except Exception:  # not listening yet
        return False
    return True


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""
    except OSError:
        return False


async def test_a_pid_file_naming_another_process_leaves_that_process_alone(tmp_path):
    """The number in the pid file may belong to anything by now: only a nats-server on this
    store is stopped (here the number is this test's own process)."""
    store = tmp_path / "store"
    store.mkdir()
    (store / PID_FILE).write_text(f"{os.getpid()}\n")
    async with EmbeddedServer(port=-1, store_dir=store) as server, Broker(server.url) as b:
        await b.flush()
        assert int((store / PID_FILE).read_text()) != os.getpid()


async def test_a_restart_writes_its_own_config_whatever_the_file_says_meanwhile(tmp_path):
    """A server given its config's text writes it at each start, once it holds the store: a
    file rewritten meanwhile (another process's ports) does not move it to other ports."""
    store = tmp_path / "store"
    config = store / "nats-server.conf"
    text = f'listen: 127.0.0.1:{_free_port()}\njetstream {{ store_dir: "{store}" }}\n'
    async with EmbeddedServer(store_dir=store, config=config, config_text=text) as server:
        first = server.url
        await server.kill()
        config.write_text(text.replace(first.rsplit(":", 1)[1], str(_free_port())))
        await server.restart()
        assert server.url == first
        assert config.read_text() == text
        async with Broker(server.url) as b:
            await b.flush()


async def test_a_server_refused_for_a_store_in_use_writes_nothing(tmp_path):
    """A second server on a store in use is refused before it writes its config."""
    store = tmp_path / "store"
    config = store / "nats-server.conf"
    text = f'listen: 127.0.0.1:{_free_port()}\njetstream {{ store_dir: "{store}" }}\n'
    async with EmbeddedServer(store_dir=store, config=config, config_text=text):
        second = EmbeddedServer(store_dir=store, config=config, config_text=text + "# other\n")
        with pytest.raises(EmbeddedServerError, match="is in use by"):
            await second.__aenter__()
        assert config.read_text() == text


def _free_port() -> int:
    """Below the ephemeral range: a server restarted on it finds it free (broker.ports)."""
    return free_ports("127.0.0.1", 1)[0]


async def test_a_free_port_is_below_the_ephemeral_range_and_kept_for_a_restart(tmp_path):
    """On a port the kernel picked (in its ephemeral range), a client reconnecting during a
    restart may be given that very port as its source and connect to itself, holding it:
    the restart failed "address already in use" (a trial)."""
    low = ephemeral_low()
    server = EmbeddedServer(port=-1, store_dir=tmp_path / "nats")
    async with server:
        port = server.port
        assert 10_000 <= port < low and server.url.endswith(f":{port}")
        await server.kill()
        await server.restart()
        assert server.port == port
