"""The processes of a chaos run: a nats-server that can be stopped and started again on the
same port and store, and `reach` services, each in its own process group, that can be killed.

A service that exits without being told to, fails its stop or hangs in it, is recorded as an
:class:`UnexpectedExit` with its last words: a service must ride out every fault of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentreach.broker import EmbeddedServer
from agentreach.broker.ports import free_ports
from tests.chaos.accounting import Outage

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
TAIL_LINES = 200
TAIL_SHOWN = 12  # lines of a failed service's output in a report
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class UnexpectedExit:
    """A service that ended badly: on its own during the run, or with a failure status when
    asked to stop (its run had crashed while the process lived on); with its last words."""

    name: str
    pid: int
    how: str
    tail: tuple[str, ...]

    def __str__(self) -> str:
        shown = "\n    ".join(_gist(self.tail)) or "(no output)"
        return f"{self.name} (pid {self.pid}) {self.how}; its last words:\n    {shown}"


def _gist(tail: tuple[str, ...]) -> list[str]:
    """The last lines printed; of a traceback, the frames in our code and the error."""
    if not any("Traceback (most recent call last)" in line for line in tail):
        return list(tail[-TAIL_SHOWN:])
    ours = [
        line.strip(" |")
        for line in tail
        if 'File "' in line and "site-packages" not in line and "/lib/python3." not in line
    ]
    error = [line.strip(" |") for line in tail if line.strip(" |+-")][-1:]
    return ours[-TAIL_SHOWN:] + error


class StartFailed(RuntimeError):
    """A service did not announce that it serves."""


def free_port() -> int:
    """A loopback port nobody listens on now, below the ephemeral range: other servers
    started with ``-p -1`` never take it while this one is down for a restart."""
    return free_ports("127.0.0.1", 1)[0]


def _die_with_parent() -> Callable[[], None] | None:
    """For the child: Linux kills it when the harness dies, however hard. A service reconnects
    forever by design, and in a session of its own no Ctrl-C reaches it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


_DIE_WITH_PARENT = _die_with_parent()


class NatsServer:
    """nats-server with JetStream on a fixed loopback port and store, restartable."""

    def __init__(self, *, port: int, store_dir: Path) -> None:
        self.port = port
        self.store_dir = store_dir
        self.url = f"nats://127.0.0.1:{port}"
        self._server: EmbeddedServer | None = None

    async def start(self) -> None:
        server = EmbeddedServer(port=self.port, store_dir=self.store_dir, ready_timeout=30.0)
        await server.__aenter__()
        self._server = server

    async def stop(self) -> None:
        """A clean stop (SIGTERM): JetStream writes its state, clients see the connection go."""
        if self._server is not None:
            await self._server.stop()
            self._server = None

    async def kill(self) -> None:
        """kill -9: what it had not written to its store yet is lost."""
        if self._server is not None:
            await self._server.kill()
            self._server = None


class Service:
    """A long-running `reach` command: started, awaited until it says it serves, killed."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str | Path],
        *,
        cwd: Path,
        env: dict[str, str],
        log_path: Path,
        exits: list[UnexpectedExit],
        away: dict[int, list[Outage]],
    ) -> None:
        self.name = name
        self._argv = [str(a) for a in argv]
        self._cwd = cwd
        self._env = env
        self._log_path = log_path
        self._exits = exits
        self._away = away  # each process's time without a connection, by pid, from its log
        self._process: asyncio.subprocess.Process | None = None
        self._told: signal.Signals | None = None  # how we asked the current process to end
        self._hung = False  # it did not end when asked to stop
        self._ready = asyncio.Event()
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._watch: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        """Start the command and wait until it announces ``serving``."""
        assert not self.running, f"{self.name} is running already"
        self._ready = asyncio.Event()
        self._told = None
        self._hung = False
        self._tail.clear()
        self._process = await asyncio.create_subprocess_exec(
            *self._argv,
            cwd=self._cwd,
            env=self._env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed with everything it started
            preexec_fn=_DIE_WITH_PARENT,
        )
        self._watch = asyncio.create_task(self._follow(self._process), name=f"watch-{self.name}")
        ready = asyncio.create_task(self._ready.wait())
        try:
            await asyncio.wait(
                {ready, self._watch}, timeout=READY_TIMEOUT_S, return_when="FIRST_COMPLETED"
            )
        finally:
            ready.cancel()
        if not self._ready.is_set():
            await self.kill()
            tail = "\n".join(self._tail) or "(no output)"
            raise StartFailed(f"{self.name} did not start serving:\n{tail}")

    async def kill(self) -> tuple[int, float]:
        """kill -9 the process group; returns the pid and the wall-clock time of the kill."""
        return await self._signal(signal.SIGKILL, timeout=STOP_TIMEOUT_S)

    async def stop(self) -> None:
        """SIGTERM (a drained stop), then SIGKILL if it has not exited in time."""
        if not self.running:
            return
        try:
            await self._signal(signal.SIGTERM, timeout=STOP_TIMEOUT_S)
        except TimeoutError:
            self._hung = True
            await self.kill()

    async def _signal(self, sig: signal.Signals, *, timeout: float) -> tuple[int, float]:
        process = self._process
        assert process is not None
        self._told = sig
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        assert self._watch is not None
        await asyncio.wait_for(asyncio.shield(self._watch), timeout)
        return process.pid, at

    async def _follow(self, process: asyncio.subprocess.Process) -> None:
        """Copy the output to the log file, see the announcement, note an exit on its own."""
        assert process.stdout is not None
        away, left = self._away.setdefault(process.pid, []), None
        with self._log_path.open("a") as log:
            log.write(f"=== {self.name} pid {process.pid} started {time.strftime('%X')}\n")
            while line := await process.stdout.readline():
                text = line.decode(errors="replace").rstrip()
                log.write(text + "\n")
                self._tail.append(text)
                if " serving " in text and "(Ctrl-C to stop)" in text:  # a line, or JSON
                    self._ready.set()
                elif "nats disconnected" in text and left is None:
                    left = time.time()
                elif "nats reconnected" in text and left is not None:
                    away.append(Outage(left, time.time()))
                    left = None
            if left is not None:
                away.append(Outage(left, time.time()))
            returncode = await process.wait()
            log.write(f"=== {self.name} pid {process.pid} exited {returncode}\n")
        if (how := self._judge(returncode)) is not None:
            self._exits.append(UnexpectedExit(self.name, process.pid, how, tuple(self._tail)))

    def _judge(self, returncode: int) -> str | None:
        """What was wrong with this end, if anything."""
        if self._told is None:
            return f"exited on its own with status {returncode}"
        if self._hung:
            return f"did not stop within {STOP_TIMEOUT_S:g} s of SIGTERM (killed)"
        if self._told is signal.SIGTERM and returncode not in (0, -signal.SIGTERM):
            return f"exited with status {returncode} when asked to stop"
        return None
