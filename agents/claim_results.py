"""What claiming a message for a run can come to (:meth:`Claims.claim`): claimed, or why
not — it ran already (done or failed), it was ended or moved by the coordinator, or another
delivery holds it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agentreach.envelopes import REASSIGNED, ErrorInfo, Execution


@dataclass(slots=True)
class Claimed:
    """This delivery runs the message; ``revision`` guards the record's next write (a renewed
    lease moves it, under ``lock``, so that the outcome is written over the latest one)."""

    revision: int
    lease_until_ms: int = 0
    seal: str | None = None  # the dispatch's, in every write of the record
    started_ms: int = 0  # when the attempt's run began, in every write of the record
    resumed: bool = False  # taken over from a run of the attempt that crashed
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class AlreadyDone:
    """The message ran before; here is what it returned."""

    record: Execution


@dataclass(frozen=True, slots=True)
class AlreadyFailed:
    """This attempt ran here and failed: not to be run again (its redelivery, after the
    acknowledgement of its report was lost); its failure is reported again."""

    record: Execution


@dataclass(frozen=True, slots=True)
class Expired:
    """The attempt was ended as expired already (its expiry fence stands): not to be run."""

    record: Execution


@dataclass(frozen=True, slots=True)
class Moved:
    """The attempt was taken from this agent while it waited in its queue (the agent was
    judged gone; the next attempt runs elsewhere): not to be run."""

    record: Execution

    @property
    def error(self) -> ErrorInfo:
        """What the agent reports of it (``failed``): a move cut short after its fence (the
        coordinator or the server died) is sent on from there; one that went through is
        left alone."""
        moved = ErrorInfo(type=REASSIGNED, message="a later attempt ran here", retryable=True)
        return self.record.error or moved


@dataclass(frozen=True, slots=True)
class Busy:
    """Another delivery holds the lease; try again after ``retry_in_s``."""

    retry_in_s: float


Claim = Claimed | AlreadyDone | AlreadyFailed | Expired | Moved | Busy
