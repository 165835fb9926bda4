"""Asking several listeners at once and collecting whoever answers (scatter-gather)."""

from __future__ import annotations

import asyncio

import nats.errors

from agentreach.broker.connection import Broker
from agentreach.broker.errors import translated


async def gather_replies(
    broker: Broker,
    subject: str,
    data: bytes = b"",
    *,
    wait_s: float,
    first_within_s: float | None = None,
    inbox: str | None = None,
) -> list[bytes]:
    """Ask every listener on ``subject`` and collect the answers that come within ``wait_s``.

    ``first_within_s`` (longer): how long the first answer may take, the others then having
    ``wait_s`` from it — a busy listener is not taken for none. With nobody listening the
    server says so at once, and nothing is waited for. ``inbox``: where the answers come
    (a probe's, :func:`probe_inbox`); a new inbox by default."""
    inbox = inbox or broker.new_inbox()
    answers: list[bytes] = []
    loop = asyncio.get_running_loop()
    with translated(subject=subject):
        sub = await broker.nc.subscribe(inbox)
    try:
        with translated(subject=subject):
            await broker.nc.publish(subject, data, reply=inbox)
        deadline = loop.time() + max(wait_s, first_within_s or 0)
        while (left := deadline - loop.time()) > 0:
            try:
                answer = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            if not answer.data:  # the server's "no responders" status: nobody listens
                break
            if not answers and first_within_s is not None:
                deadline = loop.time() + wait_s
            answers.append(answer.data)
    finally:
        await sub.unsubscribe()
    return answers
