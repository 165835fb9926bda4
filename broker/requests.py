"""Asking several listeners at once and collecting whoever answers (scatter-gather)."""

from __future__ import annotations

import asyncio

import nats.errors

from agentreach.broker.connection import Broker
from agentreach.broker.errors import translated


async def gather_replies(
    broker: Broker, subject: str, data: bytes = b"", *, wait_s: float
) -> list[bytes]:
    """Ask every listener on ``subject`` and collect the answers that come within ``wait_s``."""
    inbox = broker.new_inbox()
    answers: list[bytes] = []
    with translated(subject=subject):
        sub = await broker.nc.subscribe(inbox)
    try:
        with translated(subject=subject):
            await broker.nc.publish(subject, data, reply=inbox)
        deadline = asyncio.get_running_loop().time() + wait_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                answer = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            if answer.data:  # an empty one is the server's "no responders" status
                answers.append(answer.data)
    finally:
        await sub.unsubscribe()
    return answers
