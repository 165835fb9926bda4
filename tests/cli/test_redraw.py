"""Redrawing until Ctrl-C: the signal ends the loop even when a draw swallows a cancel."""

from __future__ import annotations

import asyncio
import os
import signal

from agentreach.cli.redraw import INTERRUPTED, redraw_until_interrupted


async def test_redraws_until_sigint(capsys):
    drawn = 0

    async def draw() -> str:
        nonlocal drawn
        drawn += 1
        if drawn == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return f"table {drawn}"

    assert await redraw_until_interrupted(draw, 0.01) == INTERRUPTED
    assert drawn == 3
    # The draw under way at Ctrl-C is not printed.
    assert capsys.readouterr().out.split() == ["table", "1", "table", "2"]


async def test_sigint_ends_a_draw_that_swallows_its_cancel(capsys):
    """nats-py and Python 3.11's wait_for lose a cancel now and then: asyncio.run's one
    cancel of the main task then left `reach agents --watch` drawing after Ctrl-C."""
    started = asyncio.Event()
    swallowed = 0

    async def draw() -> str:
        nonlocal swallowed
        started.set()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:
                    raise

    async def interrupt() -> None:
        await started.wait()
        os.kill(os.getpid(), signal.SIGINT)

    interrupting = asyncio.create_task(interrupt())
    assert await asyncio.wait_for(redraw_until_interrupted(draw, 0.01), 10) == INTERRUPTED
    await interrupting
    assert swallowed == 2  # cancelled again after the first was lost
    assert capsys.readouterr().out == ""


async def test_signal_handlers_are_given_back():
    async def draw() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        return "once"

    await redraw_until_interrupted(draw, 0.01)
    loop = asyncio.get_running_loop()
    assert not loop.remove_signal_handler(signal.SIGTERM)  # none left installed
