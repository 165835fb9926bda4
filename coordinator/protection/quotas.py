"""Callers' quotas: one token bucket per caller, shared by every coordinator replica.

A caller's bucket is a :class:`QuotaRecord` in KV ``reach_quotas``: the tokens left at
``at_ms``. A replica admits a task by refilling the record up to now and taking a token, in
one compare-and-set on the revision it saw last; a replica that lost the race reads again
and decides again. So three replicas admitting one caller together never admit more than
the one bucket would.

Each replica keeps the record and revision it last wrote or read. While no other replica
writes the caller's record, an admission is one KV write; after another did, the write
fails and a read and a write follow. A refusal needs no round trip at all when the kept
record has no token by now: other replicas only ever take tokens, so the stored bucket
holds no more than the kept one does. Refills are counted on each replica's wall clock.

On a cluster a charge can lose every race (the server refuses a conditional write while
another to the key is applied). The token is then taken from the kept record alone, if it
has one, and owed: the next write that gets through charges it to the shared bucket (below
zero if need be), so over time a caller gets no more than its quota.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import structlog

from agentreach.broker import Broker, Bucket, Contended, Entry
from agentreach.coordinator.protection.rate_limits import RateLimits
from agentreach.envelopes import QuotaRecord, RateLimit, is_token, now_ms

log = structlog.get_logger("coordinator.quotas")

KEPT = 10_000  # callers whose record this replica keeps (the least recent go first)


def refilled(record: QuotaRecord | None, limit: RateLimit, at_ms: int) -> QuotaRecord:
    """``record`` refilled at ``limit.rate`` up to ``at_ms``; a new caller's is full.

    A clock behind the record's refills nothing and does not move it back, so no span of
    time is refilled twice (a clock ahead refills early, by its lead at most)."""
    if record is None:
        return QuotaRecord(tokens=float(limit.burst), at_ms=at_ms)
    at = max(record.at_ms, at_ms)
    tokens = record.tokens + (at - record.at_ms) * limit.rate / 1000
    return QuotaRecord(tokens=min(float(limit.burst), tokens), at_ms=at)


def taken(
    record: QuotaRecord | None, limit: RateLimit, at_ms: int, owed: int = 0
) -> QuotaRecord | None:
    """``record`` with one token taken at ``at_ms``, and the ``owed`` ones taken here
    before, unwritten (below zero if need be: refilled before anyone's next, so the quota
    holds over time; at most a burst below); None when it has no token."""
    full = refilled(record, limit, at_ms)
    if full.tokens < 1:
        return None
    return msgspec.structs.replace(full, tokens=max(full.tokens - 1 - owed, -limit.burst))


def wait_ms(record: QuotaRecord | None, limit: RateLimit, at_ms: int, owed: int = 0) -> int:
    """Milliseconds from ``at_ms`` until ``record`` has a token beyond the ``owed`` ones
    (0: it has one)."""
    tokens = refilled(record, limit, at_ms).tokens - owed
    return 0 if tokens >= 1 else math.ceil((1 - tokens) * 1000 / limit.rate)


def quota_key(caller: str) -> str:
    """The caller's key: its name, or a digest of a name that is no token (an open server
    lets a subject carry any characters; a KV key may not)."""
    return caller if is_token(caller) else "=" + hashlib.sha256(caller.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class OverQuota:
    """Why a caller's task was refused: its quota (by its name in the config: the
    caller's or ``default``), and when a token will be there."""

    caller: str
    quota: str
    limit: RateLimit
    retry_after_ms: int
    contended: bool = False  # not known to be over: its shared record stayed too busy to take

    def why(self) -> str:
        """The refusal in words, for the caller's error and the log."""
        limit = f"{self.quota!r} ({self.limit.rate:g}/s, burst {self.limit.burst})"
        if self.contended:
            return (
                f"the quota {limit} of caller {self.caller!r} could not be charged: the"
                f" coordinator replicas lost every race to update it; retry in"
                f" {self.retry_after_ms} ms"
            )
        return (
            f"caller {self.caller!r} is over its quota {limit}; retry in {self.retry_after_ms} ms"
        )


@dataclass(slots=True)
class _Kept:
    """What this replica knows of one caller: its last record (None: not seen yet), and a
    lock so that its tasks take their tokens one after another here (no race lost to
    ourselves)."""

    entry: Entry[QuotaRecord] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    owed: int = 0  # tokens taken here while every write lost, charged with the next write


class CallerQuotas:
    """Admits a caller's task while its shared bucket has a token."""

    def __init__(
        self, broker: Broker, config: RateLimits, *, clock: Callable[[], int] = now_ms
    ) -> None:
        self._broker = broker
        self._config = config
        self._clock = clock
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._bucket: Bucket[QuotaRecord] | None = None
        self.admitted = 0  # tasks of callers with a quota, since start
        self.refused = 0
        self.charged_here = 0  # of the admitted: charged to this replica's record alone

    def limits(self, caller: str) -> bool:
        """Whether ``caller`` has a quota (its own, or the default)."""
        return self._config.caller_quota(caller) is not None

    async def admit(self, caller: str) -> OverQuota | None:
        """Take a token of ``caller``'s quota: None when taken (or it has no quota), else
        why not. Callers without a quota cost no round trip."""
        quota = self._config.caller_quota(caller)
        if quota is None:
            return None
        kept = self._keep(caller)
        async with kept.lock:
            try:
                wait = await self._take(caller, quota[1], kept)
            except Contended:  # other replicas won every race
                wait = self._take_here(quota[1], kept)
                if wait is None:
                    self.refused += 1
                    retry_ms = math.ceil(1000 / quota[1].rate)
                    return OverQuota(caller, *quota, retry_ms, contended=True)
        if not wait:
            self.admitted += 1
            return None
        self.refused += 1
        return OverQuota(caller, *quota, wait)

    async def _take(self, caller: str, limit: RateLimit, kept: _Kept) -> int:
        """Take a token: 0 when taken, else the milliseconds until one is there."""
        known, owed = kept.entry, kept.owed
        if known is not None and (wait := wait_ms(known.value, limit, self._clock())):
            return wait  # the store has no more tokens than the record we kept
        bucket = await self._records()
        # Overwritten by anyone (the server's answer aimed at the key): not a reset, which
        # would hand the caller a full bucket as often as it liked. Go on from the record
        # kept, else from an empty bucket.
        instead = known.value if known else QuotaRecord(tokens=0, at_ms=self._clock())
        swap = await bucket.cas(
            quota_key(caller),
            lambda current: taken(current, limit, self._clock(), owed),
            known=known,  # None: try it as a new caller; a lost race reads the record
            unreadable=lambda: instead,
        )
        entry = swap.entry
        if entry is not None and entry.value is None:  # the unreadable record, left as it was
            entry = Entry(entry.key, instead, entry.revision)
        kept.entry = entry
        if swap.written:
            kept.owed = 0  # charged with this write
            return 0
        return max(1, wait_ms(entry.value if entry else None, limit, self._clock()))

    def _take_here(self, limit: RateLimit, kept: _Kept) -> int | None:
        """After every race was lost: a token taken from the record this replica read last,
        as it stands refilled to now, less those taken so already (0), or the milliseconds
        until it has one; None when this replica has read none. Refusing dead-lettered
        tasks of a caller at half its quota (a trial on a cluster). They are owed: the next
        write that gets through charges them to the shared bucket, so the quota holds over
        time (a replica that stops meanwhile leaves at most its record's tokens unpaid)."""
        known = kept.entry
        if known is None:
            return None
        if wait := wait_ms(known.value, limit, self._clock(), kept.owed):
            return wait
        kept.owed += 1  # charged to the shared record with the next write that gets through
        self.charged_here += 1
        log.debug("quota charged on this replica: the shared record stayed too busy to write",
                  key=known.key, owed=kept.owed)  # fmt: skip
        return 0

    def _keep(self, caller: str) -> _Kept:
        kept = self._kept.get(caller)
        if kept is None:
            kept = self._kept[caller] = _Kept()
            if len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        self._kept.move_to_end(caller)
        return kept

    async def _records(self) -> Bucket[QuotaRecord]:
        if self._bucket is None:
            names = self._broker.names
            self._bucket = await self._broker.bucket(names.quotas_bucket, QuotaRecord)
        return self._bucket
