"""Run-once records in KV ``reach_executions``: an agent's claim on a message and its outcome."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentreach.envelopes.messages import ErrorInfo, PayloadRef


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's record of running one message, in ``reach_executions`` by message_id.

    ``running`` holds a lease: until ``lease_until_ms`` no other delivery of the
    message may run it. ``done`` keeps the result, so a redelivery or a republish
    gets it again without running twice. ``failed`` lets the next attempt run.
    """

    v: Literal[1] = 1
    message_id: str
    state: Literal["running", "done", "failed"]
    agent_id: str
    epoch: int = 0
    attempt: int = 1
    lease_until_ms: int = 0
    result: Any = None
    result_ref: PayloadRef | None = None  # a result kept in the Object Store
    error: ErrorInfo | None = None
    finished_at_ms: int = 0
