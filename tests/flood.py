"""A flood of core messages on one subject, from a process of its own, for tests of what a
party with the right to publish there can do: ``python -m tests.flood URL SUBJECT SECONDS``
(NATS_CREDS: its creds). Publishes as fast as one connection can, then exits."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import nats


async def flood(url: str, subject: str, seconds: float) -> int:
    creds = os.environ.get("NATS_CREDS") or None
    nc = await nats.connect(url, user_credentials=creds, pending_size=64 * 1024 * 1024)
    inbox = nc.new_inbox()  # an inbox of the flooder's own: it may answer there
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(500):
            await nc.publish(subject, b"", reply=inbox)
        sent += 500
        await asyncio.sleep(0)
    await nc.flush(timeout=60)
    await nc.close()
    return sent


if __name__ == "__main__":
    url, subject, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    print(f"sent {asyncio.run(flood(url, subject, seconds))}", file=sys.stderr)
