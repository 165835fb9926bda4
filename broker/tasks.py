"""Stopping background tasks for sure."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any], poll_s: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until every one has ended.

    The cancellation is repeated while a task goes on: nats-py swallows a
    CancelledError now and then (in a flush, a publish waiting for room), and
    one lost cancel must not hang a shutdown. Exceptions stay with the tasks.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=poll_s)
