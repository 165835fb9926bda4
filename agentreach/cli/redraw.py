"""Redrawing a table until Ctrl-C, for ``reach agents --watch`` and ``reach top``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable

from agentreach.broker.tasks import cancel_and_wait
from agentreach.cli.exit_codes import INTERRUPTED
from agentreach.cli.terminal import control


async def redraw_until_interrupted(draw: Callable[[], Awaitable[str]], every_s: float) -> int:
    """Print what ``draw`` returns every ``every_s`` seconds until SIGINT or SIGTERM.

    The signals set an event instead of cancelling the command: asyncio.run's Ctrl-C is
    one cancel of the main task, and a cancel that lands as a reply arrives is swallowed
    now and then (nats-py's requests, Python 3.11's ``wait_for``), which left the command
    drawing for ever after Ctrl-C. A draw under way is cancelled until it ends."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            drawn = await _unless_stopped(draw(), stop)
            if drawn is None:
                break
            # A terminal is cleared before each redraw; a pipe or file gets each one after the last.
            if sys.stdout.isatty():
                control("\033[2J\033[H")
            else:
                print()
            print(drawn, flush=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):
                    await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return INTERRUPTED


async def _unless_stopped(drawing: Awaitable[str], stop: asyncio.Event) -> str | None:
    """What ``drawing`` returns, or None when ``stop`` is set first (it is then cancelled)."""
    draw = asyncio.ensure_future(drawing)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait((draw, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(stopped)
    if stop.is_set():
        await cancel_and_wait(draw)
        return None
    return draw.result()
