"""One delivery of a task to an agent, with what the coordinator handed out with it."""

from __future__ import annotations

from dataclasses import dataclass

from agentreach.broker import Delivery
from agentreach.broker.lifecycle import GRANT_HEADER, SEAL_HEADER
from agentreach.envelopes import Task


@dataclass(frozen=True, slots=True)
class Job:
    """One delivery of a task to this agent, with what the coordinator handed out with it."""

    delivery: Delivery
    task: Task

    @property
    def dispatched_ms(self) -> int:
        return self.delivery.timestamp_ms

    @property
    def grant(self) -> str | None:
        """The coordinator's proof that this attempt was given to this agent; every event
        about it carries the grant back."""
        return self.delivery.headers.get(GRANT_HEADER)

    @property
    def seal(self) -> str | None:
        """The coordinator's seal for this agent's execution record of the attempt: every
        write of the record carries it, or a secured coordinator does not believe it."""
        return self.delivery.headers.get(SEAL_HEADER)
