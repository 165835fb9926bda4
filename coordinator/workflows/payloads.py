"""A workflow's starting payload, fetched back when the intake stowed it in the claim check.

Every step's input is made from the starting task's payload (``input``, the first step's
``prev``), which the instance's record keeps inline. A payload over the claim-check
threshold reached the steps as null: the record kept the reference, and nothing read it.
"""

from __future__ import annotations

import msgspec

from agentreach.broker import Broker, BrokerError, ClaimCheck
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.envelopes import DecodeError, ErrorInfo, Task


async def inline_payload(broker: Broker, claim_check: ClaimCheck, task: Task) -> Task | None:
    """``task`` with its payload inline; None when a stowed one cannot be read (the task is
    refused, nothing ran). Kept inline, a payload too large for the record fails the start
    as ``record_too_large``, which says so."""
    if task.payload_ref is None:
        return task
    try:
        payload = await claim_check.payload_of(task)
    except (BrokerError, DecodeError) as exc:
        error = ErrorInfo(type="payload_unavailable", message=str(exc), retryable=False)
        await end_with_error(broker, task, "rejected", error, ran=False, started=False)
        return None
    return msgspec.structs.replace(task, payload=payload, payload_ref=None)
