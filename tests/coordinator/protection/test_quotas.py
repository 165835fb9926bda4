"""Callers' quotas: the bucket arithmetic, one shared bucket across replicas, the config."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from agentreach.broker import Broker, Contended
from agentreach.coordinator import ConfigError, RateLimits, load_config
from agentreach.coordinator.protection.quotas import (
    CallerQuotas,
    quota_key,
    refilled,
    taken,
    wait_ms,
)
from agentreach.envelopes import QuotaRecord, RateLimit
from tests.support import until_true

LIMIT = RateLimit(rate=5, burst=3)


def test_a_new_caller_starts_full_and_spends_down_to_nothing():
    """A caller never seen has ``burst`` tokens; each take spends one, then none is left."""
    record = None
    for left in (2, 1, 0):
        record = taken(record, LIMIT, 1_000)
        assert record == QuotaRecord(tokens=left, at_ms=1_000)
    assert taken(record, LIMIT, 1_000) is None
    assert wait_ms(record, LIMIT, 1_000) == 200  # one token at 5/s


def test_refill_follows_the_rate_and_stops_at_the_burst():
    """Tokens come back at ``rate`` per second, never past ``burst``."""
    empty = QuotaRecord(tokens=0, at_ms=1_000)
    assert refilled(empty, LIMIT, 1_100).tokens == pytest.approx(0.5)
    assert wait_ms(empty, LIMIT, 1_100) == 100
    assert refilled(empty, LIMIT, 60_000).tokens == 3
    assert refilled(QuotaRecord(tokens=9, at_ms=0), LIMIT, 0).tokens == 3  # burst lowered


def test_tokens_owed_are_taken_with_the_next_one_down_to_a_burst_below_zero():
    """A replica that charged tokens to its own record while every write lost pays them
    with its next write: below zero if need be, never more than a burst below."""
    full = QuotaRecord(tokens=3, at_ms=1_000)
    assert taken(full, LIMIT, 1_000, owed=1) == QuotaRecord(tokens=1, at_ms=1_000)
    assert taken(full, LIMIT, 1_000, owed=4) == QuotaRecord(tokens=-2, at_ms=1_000)
    assert taken(full, LIMIT, 1_000, owed=50) == QuotaRecord(tokens=-3, at_ms=1_000)
    assert wait_ms(QuotaRecord(tokens=-1, at_ms=1_000), LIMIT, 1_000) == 400


def test_a_clock_behind_the_record_refills_nothing_and_keeps_its_time():
    """A replica whose clock is behind the record's neither refills nor moves it back, so
    the same span of time is never refilled twice."""
    record = QuotaRecord(tokens=0.5, at_ms=5_000)
    assert refilled(record, LIMIT, 4_000) == record
    assert taken(record, LIMIT, 4_000) is None


def test_keys_are_the_caller_or_a_digest_of_a_name_no_key_may_hold():
    """A token names its own key; anything else a subject may carry is digested."""
    assert quota_key("alice") == "alice"
    odd = quota_key("al@ice")
    assert odd.startswith("=") and odd != quota_key("al#ice")


def test_a_caller_gets_its_own_quota_else_the_default_else_none():
    """``callers.<name>`` wins over ``callers.default``; without either there is no quota."""
    own, default = RateLimit(rate=1, burst=1), RateLimit(rate=9, burst=9)
    limits = RateLimits(callers={"alice": own, "default": default})
    assert limits.caller_quota("alice") == ("alice", own)
    assert limits.caller_quota("bob") == ("default", default)
    assert RateLimits(callers={"alice": own}).caller_quota("bob") is None


def test_quota_config_errors_name_their_path(tmp_path):
    """A wrong quota fails at start naming where it is in the file."""
    cases = {
        "rate_limits: {callers: {alice: {rate: 0, burst: 1}}}": r"\$\.rate_limits\.callers.*rate",
        "rate_limits: {callers: {alice: {rate: 1}}}": r"missing required field `burst`",
        "rate_limits: {callers: {a.b: {rate: 1, burst: 1}}}": r"key.*\$\.rate_limits\.callers",
        "rate_limits: {callers: {alice: {rate: 1, brust: 2}}}": r"unknown field `brust`",
    }
    path = tmp_path / "coordinator.yaml"
    for text, expected in cases.items():
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=expected):
            load_config(path)
    path.write_text("rate_limits: {callers: {default: {rate: 2, burst: 4}}}\n")
    assert load_config(path).rate_limits.caller_quota("x") == (
        "default",
        RateLimit(rate=2, burst=4),
    )


class Clock:
    """A wall clock in ms that moves only when told."""

    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@contextlib.asynccontextmanager
async def replicas(
    broker: Broker, config: RateLimits, clock: Clock, n: int
) -> AsyncIterator[list[CallerQuotas]]:
    """``n`` quota keepers, each on a connection of its own, like coordinator replicas."""
    async with contextlib.AsyncExitStack() as stack:
        quotas = []
        for i in range(n):
            own = await stack.enter_async_context(
                Broker(broker.url, names=broker.names, name=f"replica-{i}")
            )
            quotas.append(CallerQuotas(own, config, clock=clock))
        yield quotas


async def admitted(quotas: list[CallerQuotas], caller: str, n: int) -> int:
    """Ask ``n`` times, spread round-robin over the replicas, all at once; how many passed."""
    verdicts = await asyncio.gather(*(quotas[i % len(quotas)].admit(caller) for i in range(n)))
    return sum(1 for v in verdicts if v is None)


async def test_three_replicas_together_admit_exactly_one_bucket(broker):
    """Three replicas asking at once for one caller admit exactly the burst, then exactly
    what the rate refills; each admission is one write of the shared record."""
    clock = Clock()
    config = RateLimits(callers={"alice": RateLimit(rate=10, burst=20)})
    async with replicas(broker, config, clock, 3) as quotas:
        assert await admitted(quotas, "alice", 60) == 20
        clock.ms += 500  # five tokens come back
        assert await admitted(quotas, "alice", 60) == 5
        clock.ms += 60_000  # full again, not fuller
        assert await admitted(quotas, "alice", 60) == 20
        assert sum(q.admitted for q in quotas) == 45
        assert sum(q.refused for q in quotas) == 135
    records = await broker.bucket(broker.names.quotas_bucket, QuotaRecord)
    entry = await records.get("alice")
    assert entry is not None and entry.value.tokens == 0
    assert entry.revision == 45  # one write per admission, none for a refusal


async def test_a_refusal_says_when_a_token_is_back_and_names_the_quota(broker):
    """Over its quota a caller hears which quota and how long until a token is there."""
    clock = Clock()
    config = RateLimits(callers={"default": RateLimit(rate=4, burst=1)})
    async with replicas(broker, config, clock, 2) as (one, two):
        assert await one.admit("bob") is None
        over = await two.admit("bob")  # the other replica sees the same empty bucket
        assert over is not None
        assert (over.caller, over.quota, over.retry_after_ms) == ("bob", "default", 250)
        clock.ms += 250
        assert await two.admit("bob") is None


async def test_a_record_too_busy_to_charge_is_refused_as_such_not_as_over(broker, monkeypatch):
    """On a cluster, replicas charging one caller lose races the server decides (a write is
    refused while another to the key is applied); 20 lost in a row said the caller was "over
    its quota" at half of it (a trial). It is refused, saying the record was too busy."""
    config = RateLimits(callers={"default": RateLimit(rate=100, burst=200)})
    async with replicas(broker, config, Clock(), 1) as (one,):
        records = await one._records()

        async def always_lost(*args: object, **kwargs: object) -> object:
            raise Contended("reach_quotas/carol changed under us 20 times in a row")

        monkeypatch.setattr(records, "cas", always_lost)
        over = await one.admit("carol")
    assert over is not None and over.contended and over.retry_after_ms == 10
    assert "could not be charged" in over.why() and "over its quota" not in over.why()


async def test_a_record_too_busy_to_charge_is_charged_to_what_this_replica_read(
    broker, monkeypatch
):
    """Refusing a caller at half its quota dead-lettered its tasks. With every race lost,
    the token is taken from the record this replica read last, as it stands refilled, and
    owed: the next write charges them to the shared bucket, below zero if need be (without
    that, a caller provoking contention got up to a burst more each time: a review)."""
    clock = Clock()
    async with replicas(broker, RateLimits(callers={"default": LIMIT}), clock, 1) as (one,):
        assert await one.admit("dave") is None  # read and written: 2 tokens left
        records = await one._records()

        async def always_lost(*args: object, **kwargs: object) -> object:
            raise Contended("reach_quotas/dave changed under us 20 times in a row")

        monkeypatch.setattr(records, "cas", always_lost)
        assert [await one.admit("dave") for _ in range(2)] == [None, None]
        over = await one.admit("dave")
        assert over is not None and not over.contended and over.retry_after_ms == 200
        clock.ms += 200  # refilled one token here too
        assert await one.admit("dave") is None
        monkeypatch.undo()
        assert one.charged_here == 3 and one.admitted == 4
        assert (await records.get("dave")).value.tokens == 2  # not charged meanwhile
        # The next write that gets through charges them: 3 refilled, its own and 3 owed.
        assert await one.admit("dave") is None
        assert (await records.get("dave")).value.tokens == -1
        over = await one.admit("dave")  # so the quota holds over time
        assert over is not None and over.retry_after_ms == 400


async def test_callers_are_counted_apart_and_without_a_quota_not_at_all(broker):
    """One caller's spending leaves another's bucket full; a caller with no quota is
    never looked up in KV."""
    clock = Clock()
    config = RateLimits(callers={"alice": RateLimit(rate=1, burst=2)})
    async with replicas(broker, config, clock, 1) as quotas:
        assert await admitted(quotas, "alice", 5) == 2
        assert await admitted(quotas, "bob", 50) == 50
        assert quotas[0].admitted == 2  # bob's tasks were not counted: he has no quota
    records = await broker.bucket(broker.names.quotas_bucket, QuotaRecord)
    assert set((await records.snapshot()).keys()) == {"alice"}


async def test_a_deleted_record_gives_the_caller_a_full_bucket_again(broker):
    """An operator deleting a caller's record resets its quota; a replica that kept the old
    record notices at its next write."""
    clock = Clock()
    config = RateLimits(callers={"alice": RateLimit(rate=1, burst=2)})
    records = await broker.bucket(broker.names.quotas_bucket, QuotaRecord)
    async with replicas(broker, config, clock, 1) as quotas:
        assert await admitted(quotas, "alice", 3) == 2
        await records.delete("alice")
        clock.ms += 1_000  # the kept record shows a token: the write finds the reset
        assert await admitted(quotas, "alice", 3) == 2


async def test_a_record_overwritten_with_a_server_answer_is_no_reset(broker):
    """Anyone may have the server write its answer to a request onto a caller's record (a
    reply subject is checked against no permission): read as absent, it handed the caller a
    full bucket each time (800 of 800 tasks admitted against a burst of 200). A replica
    goes on from the record it kept; one that kept none starts from an empty bucket."""
    clock = Clock()
    config = RateLimits(callers={"alice": RateLimit(rate=1, burst=3)})
    subject = f"$KV.{broker.names.quotas_bucket}.alice"

    async def overwritten() -> None:
        await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=subject)
        records = await broker.js.key_value(broker.names.quotas_bucket)
        await until_true(lambda: _overwritten(records))

    async with replicas(broker, config, clock, 2) as (kept, fresh):
        assert await admitted([kept], "alice", 2) == 2
        await overwritten()
        assert await admitted([kept], "alice", 5) == 1  # the one token it had left
        await overwritten()
        assert await admitted([fresh], "alice", 5) == 0
        clock.ms += 2_000
        assert await admitted([fresh], "alice", 5) == 2  # refilled from empty, at the rate


async def _overwritten(records) -> bool:  # type: ignore[no-untyped-def]
    return b"io.nats.jetstream.api" in ((await records.get("alice")).value or b"")
