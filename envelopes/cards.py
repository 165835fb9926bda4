"""The agent card: what an agent registers in the ``reach_agents`` bucket."""

from __future__ import annotations

from typing import Literal

import msgspec

from envelopes.types import Token


class Intent(msgspec.Struct, frozen=True, kw_only=True):
    """One topic an agent serves."""

    version: str = "1"
    capacity: int = 10
    deadline_ms: int | None = None


class AgentCard(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's record, keyed by ``agent_id``; ``epoch`` rises on every start."""

    v: Literal[1] = 1
    agent_id: Token
    intents: dict[str, Intent]
    tags: dict[str, str] = {}
    host: str = ""
    pid: int = 0
    started_at: int = 0
    epoch: int = 1
    status: Literal["running", "stopped"] = "running"

    def serves(self, topic: str) -> bool:
        return self.status == "running" and topic in self.intents
