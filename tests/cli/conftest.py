"""Running the real command-line tools: the operator's `nats` and our `reach`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def nats_cli() -> Path:
    """The `nats` binary; without it these tests skip, or fail under REACH_REQUIRE_NATS_CLI."""
    found = shutil.which("nats") or shutil.which("nats", path=str(VENV_BIN))
    if found is None:
        reason = "the nats CLI is not installed (go install github.com/nats-io/natscli/nats@v0.5.0)"
        if os.environ.get("REACH_REQUIRE_NATS_CLI") == "1":
            pytest.fail(f"REACH_REQUIRE_NATS_CLI=1 but {reason}")
        pytest.skip(reason)
    return Path(found)


async def run(
    *argv: str | Path,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Completed:
    """Run a command without blocking the event loop (the coordinator shares it)."""
    process = await asyncio.create_subprocess_exec(
        *map(str, argv),
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return Completed(process.returncode, out.decode(), err.decode())


async def started_until(
    *argv: str | Path,
    said: bytes,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    as_from_a_terminal: bool = False,
) -> asyncio.subprocess.Process:
    """Start a long-running command (its own session) and return once its log said
    ``said``; the caller stops it (``os.killpg(process.pid, ...)``). ``as_from_a_terminal``:
    with SIGINT not ignored, whatever this process's (an xdist worker ignores it, and a
    child inherits that)."""
    process = await asyncio.create_subprocess_exec(
        *map(str, argv),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=_sigint_by_default if as_from_a_terminal else None,
    )
    assert process.stderr is not None
    try:
        async with asyncio.timeout(timeout):
            while said not in (line := await process.stderr.readline()):
                if not line:
                    await process.wait()
                    raise AssertionError(f"{argv[1]} exited ({process.returncode}): {said!r}")
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        raise
    return process


async def run_in_terminal(*argv: str | Path, timeout: float = 30.0) -> Completed:
    """Run a command on a pseudo-terminal, for tools that page only on a terminal."""
    leader, follower = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        *map(str, argv), stdin=follower, stdout=follower, stderr=follower
    )
    os.close(follower)
    chunks: list[bytes] = []

    def read_all() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closes when the process exits
                return
            if not chunk:
                return
            chunks.append(chunk)

    try:
        await asyncio.wait_for(asyncio.gather(asyncio.to_thread(read_all), process.wait()), timeout)
    finally:
        os.close(leader)
    assert process.returncode is not None
    return Completed(process.returncode, b"".join(chunks).decode(errors="replace"), "")


def reach_command() -> Path:
    return VENV_BIN / "reach"


def reach_argv(broker, *args: str) -> list[str | Path]:  # type: ignore[no-untyped-def]
    """A `reach` command line aimed at ``broker``'s server and prefix."""
    return [
        reach_command(),
        *args,
        "--nats-url",
        broker.url,
        "--prefix",
        broker.names.prefix,
        "--log-format",
        "json",
    ]


def _sigint_by_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
