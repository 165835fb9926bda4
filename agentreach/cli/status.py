"""Whether coordinators run: every replica answers ``reach.ctl.status``."""

from __future__ import annotations

import sys
from typing import Any

from agentreach.broker import Broker
from agentreach.broker.requests import gather_replies
from agentreach.envelopes import DecodeError, decode_json

NOT_RUNNING = "no coordinator is running: start `reach up` or `reach coordinator`"


async def coordinators(broker: Broker, *, wait_s: float = 0.3) -> list[dict[str, Any]]:
    """The status of every coordinator replica that answers within ``wait_s`` of the first
    (which may take up to 3 s, as a busy replica may: it was taken for none)."""
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
    print(f"reach: warning: {NOT_RUNNING}; {consequence}", file=sys.stderr)
    return running
