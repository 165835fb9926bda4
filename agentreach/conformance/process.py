"""The agent under test as a process the kit starts, crashes, restarts and stops, when it is
given the agent's command (``reach conformance ID -- COMMAND …``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from agentreach.conformance.report import Failed

KILL_AFTER_S = 20.0  # a SIGTERM not obeyed by then is followed by SIGKILL


class AgentProcess:
    """One command line, run (and run again) with its output in ``log_dir``."""

    def __init__(self, argv: list[str], log_dir: Path) -> None:
        if not argv:
            raise ValueError("an agent command is needed")
        self.argv = argv
        self._log_dir = log_dir
        self._process: asyncio.subprocess.Process | None = None
        self._runs = 0
        self.log_path = log_dir / "agent-0.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        """Start the command (once more); its output goes to a fresh log file."""
        self._runs += 1
        self.log_path = self._log_dir / f"agent-{self._runs}.log"
        self._process = await self._spawn(self.log_path)

    async def kill(self) -> None:
        """A crash: SIGKILL, no chance to stop cleanly."""
        process = self._require()
        _signal(process, signal.SIGKILL)
        await process.wait()

    async def stop(self, timeout_s: float) -> int | None:
        """SIGTERM, as an operator stops a service; the exit code, or None if it had to be
        killed after ``timeout_s``."""
        process = self._require()
        if process.returncode is not None:
            return process.returncode
        _signal(process, signal.SIGTERM)
        try:
            return await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            await self.kill()
            return None

    async def twin(self, timeout_s: float) -> int | None:
        """Run a second copy while this one serves: its exit code, or None when it is still
        running after ``timeout_s`` (then it is killed)."""
        twin = await self._spawn(self._log_dir / "twin.log")
        try:
            return await asyncio.wait_for(twin.wait(), timeout_s)
        except TimeoutError:
            _signal(twin, signal.SIGKILL)
            await twin.wait()
            return None

    async def close(self) -> None:
        """Make sure nothing the kit started is left running."""
        if self.running:
            await self.stop(KILL_AFTER_S)

    def tail(self, lines: int = 15, path: Path | None = None) -> str:
        """The last lines the agent wrote, for a failure message."""
        try:
            text = (path or self.log_path).read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:])

    def exited(self) -> int | None:
        """The exit code when the process has ended, else None."""
        return self._process.returncode if self._process else None

    def _require(self) -> asyncio.subprocess.Process:
        if self._process is None:
            raise Failed("the agent process was never started")
        return self._process

    async def _spawn(self, log_path: Path) -> asyncio.subprocess.Process:
        log = log_path.open("wb")
        try:
            return await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=dict(os.environ),
                start_new_session=True,  # a Ctrl-C of the kit is the kit's to pass on
            )
        except OSError as exc:
            raise Failed(f"cannot run {self.argv[0]!r}: {exc.strerror}") from None
        finally:
            log.close()


def _signal(process: asyncio.subprocess.Process, signum: int) -> None:
    """``signum`` to the command's whole process group (its session's, made at its start):
    a command that is a wrapper (`sh -c`, `npm start`) or forks a child left it running,
    and a crash of the wrapper alone crashed no agent."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
