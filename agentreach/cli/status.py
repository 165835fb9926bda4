"""Whether coordinators run: every replica answers ``reach.ctl.status``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agentreach.agents.coordinator_presence import ASK_AGAIN_S, coordinator_runs
from agentreach.broker import Broker
from agentreach.broker.requests import gather_replies
from agentreach.envelopes import DecodeError, decode_json

NOT_RUNNING = "no coordinator is running: start `reach up` or `reach coordinator`"
# One listens and answers nothing: SIGSTOPped, overloaded, cut off (it was said not to run).
SILENT = (
    "no coordinator answers: one listens but did not answer (stopped with SIGSTOP, overloaded,"
    " or cut off from NATS); look at its process"
)


async def none_answering(broker: Broker) -> str:
    """Why no coordinator answered: none runs, or one listens and stays silent."""
    return SILENT if await coordinator_runs(broker, none_for_s=0) is None else NOT_RUNNING


async def coordinators(
    broker: Broker, *, wait_s: float = 0.3, none_for_s: float = 0.0
) -> list[dict[str, Any]]:
    """The status of every coordinator replica that answers within ``wait_s`` of the first
    (which may take up to 3 s, as a busy replica may: it was taken for none). ``none_for_s``:
    how long none must answer to be believed; just after a server restart the replicas are
    still reconnecting (`reach publish --wait` said none ran, one second too soon)."""
    deadline = asyncio.get_running_loop().time() + none_for_s
    while not (found := await _answering(broker, wait_s)):
        if asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(ASK_AGAIN_S)  # polling the server's "nobody listens"; no event
    return found


async def _answering(broker: Broker, wait_s: float) -> list[dict[str, Any]]:
    found = []
    answers = await gather_replies(broker, broker.names.status, wait_s=wait_s, first_within_s=3)
    for answer in answers:
        try:
            status = decode_json(answer)
        except DecodeError:
            continue
        if isinstance(status, dict):
            found.append(status)
    return sorted(found, key=lambda s: str(s.get("replica")))


async def warn_without_coordinator(broker: Broker, consequence: str) -> list[dict[str, Any]]:
    """Say on stderr that no coordinator runs, and what follows; the status of each replica
    that runs (empty: none)."""
    if running := await coordinators(broker):
        return running
    print(f"reach: warning: {await none_answering(broker)}; {consequence}", file=sys.stderr)
    return running
