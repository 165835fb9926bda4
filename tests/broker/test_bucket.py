"""Typed KV buckets: conditional writes, one compare-and-set for every read-decide-write."""

from __future__ import annotations

import asyncio

import msgspec
import nats.js.errors
import pytest

from agentreach.broker import BrokerError, Contended, WrongLastSequence
from agentreach.broker import bucket as bucket_module
from agentreach.broker.errors import translate
from agentreach.envelopes import DecodeError, LeaseRecord
from tests.support import until_true


@pytest.fixture
async def leases(broker):
    return await broker.bucket(broker.names.leases_bucket, LeaseRecord)


async def test_create_update_and_get_round_trip(leases):
    """create writes only where nothing is; update only at the revision read."""
    first = await leases.create("duty", LeaseRecord("a", 1))
    with pytest.raises(WrongLastSequence):
        await leases.create("duty", LeaseRecord("b", 2))
    second = await leases.update("duty", LeaseRecord("a", 3), last=first)
    with pytest.raises(WrongLastSequence):
        await leases.update("duty", LeaseRecord("b", 4), last=first)
    entry = await leases.get("duty")
    assert entry is not None and entry.value == LeaseRecord("a", 3)
    assert entry.revision == second
    await leases.delete("duty")
    assert await leases.get("duty") is None
    await leases.create("duty", LeaseRecord("c", 5))  # a deleted key can be created again


async def test_a_key_nats_refuses_is_named_with_its_bucket(leases):
    """nats-py's bare ``InvalidKeyError`` reached `reach trace '*'` as it was."""
    with pytest.raises(BrokerError, match=r"invalid key '\w+/bad!id': keys are letters"):
        await leases.get("bad!id")


async def test_cas_writes_what_change_returns_and_declines_on_none(leases):
    """change(None) creates; change(current) replaces; a None answer leaves the key alone."""
    made = await leases.cas("duty", lambda current: current or LeaseRecord("a", 1))
    assert made.written and made.entry is not None and made.entry.value.holder == "a"
    kept = await leases.cas("duty", lambda current: None)
    assert not kept.written and kept.entry == made.entry
    bumped = await leases.cas(
        "duty", lambda current: msgspec.structs.replace(current, until_ms=current.until_ms + 1)
    )
    assert bumped.entry is not None and bumped.entry.value.until_ms == 2


async def test_cas_reads_again_after_a_lost_race(leases):
    """Concurrent increments through cas lose no update: each lost race reads and decides again."""
    await leases.create("counter", LeaseRecord("n", 0))

    def increment(current: LeaseRecord | None) -> LeaseRecord:
        assert current is not None
        return LeaseRecord("n", current.until_ms + 1)

    await asyncio.gather(*(leases.cas("counter", increment) for _ in range(10)))
    entry = await leases.get("counter")
    assert entry is not None and entry.value.until_ms == 10


async def test_cas_from_a_stale_view_and_contention(leases):
    """A stale ``known`` value loses once and is corrected; no try left raises Contended."""
    written = await leases.create("duty", LeaseRecord("a", 1))
    await leases.update("duty", LeaseRecord("b", 2), last=written)
    stale = (await leases.cas("duty", lambda c: None)).entry
    assert stale is not None
    await leases.update("duty", LeaseRecord("c", 3), last=stale.revision)
    seen: list[str] = []

    def note(current: LeaseRecord | None) -> LeaseRecord:
        assert current is not None
        seen.append(current.holder)
        return LeaseRecord("d", 4)

    swap = await leases.cas("duty", note, known=stale)
    assert swap.written and seen == ["b", "c"]  # the stale view first, then the fresh read
    with pytest.raises(Contended):
        await leases.cas("duty", note, known=stale, tries=1)


async def test_a_lost_race_waits_a_growing_random_moment_before_the_next_try(leases, monkeypatch):
    """A clustered server refuses a conditional write while another to the key is applied: a
    replica trying again at once met it again and again (a quota lost 20 races in a row).
    cas pauses up to 2, 4, 8 … ms after each lost race, at most 50 ms."""
    await leases.create("duty", LeaseRecord("a", 1))
    real_update, pauses, losses = leases.update, [], [3]

    async def busy(*args: object, **kwargs: object) -> int:
        if losses[0]:
            losses[0] -= 1
            raise WrongLastSequence("wrong last sequence")
        return await real_update(*args, **kwargs)

    real_uniform = bucket_module.random.uniform

    def noted(low: float, high: float) -> float:
        pauses.append(high)  # the longest the pause may be
        return real_uniform(low, high)

    monkeypatch.setattr(leases, "update", busy)
    monkeypatch.setattr(bucket_module.random, "uniform", noted)
    swap = await leases.cas("duty", lambda current: LeaseRecord("b", 2))
    assert swap.written and pauses == [0.002, 0.004, 0.008]


async def test_unreadable_values_are_replaced_by_cas_and_left_out_of_snapshots(broker, leases):
    """A value that is not a record: cas sees None (and replaces it), snapshot leaves it out."""
    kv = await broker.kv(broker.names.leases_bucket)
    await kv.put("garbled", b"{not json")
    await leases.put("fine", LeaseRecord("a", 1))
    assert set(await leases.snapshot()) == {"fine"}
    swap = await leases.cas("garbled", lambda current: current or LeaseRecord("new", 1))
    assert swap.written
    assert set(await leases.snapshot()) == {"fine", "garbled"}


def test_a_replicated_streams_wrong_last_sequence_is_the_same_refusal():
    """10164 (a CAS conflict on an R>1 stream) is a WrongLastSequence, like 10071."""
    refused = nats.js.errors.APIError(code=400, err_code=10164, description="wrong last sequence")
    assert isinstance(translate(refused), WrongLastSequence)


async def test_an_unreadable_value_is_named_with_its_key_and_what_it_is(broker, leases):
    """`reach workflows show` of an overwritten record said only "JSON is malformed"."""
    subject = f"$KV.{broker.names.leases_bucket}.duty"
    await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=subject)
    await until_true(lambda: _held(broker))
    with pytest.raises(DecodeError, match=r"\w+/duty \(revision \d+\) holds a NATS server's"):
        await leases.get("duty")


async def _held(broker) -> bool:  # type: ignore[no-untyped-def]
    kv = await broker.js.key_value(broker.names.leases_bucket)
    try:
        return (await kv.get("duty")).value is not None
    except nats.js.errors.KeyNotFoundError:
        return False


async def test_a_read_past_a_refused_write_reads_again_a_replica_that_is_behind(
    leases, monkeypatch
):
    """In a cluster catching up after a lost majority, a direct get may be answered by a
    replica behind the leader: an agent whose outcome write landed (its answer lost) read
    its record as still `running`, and threw its own result away as fenced. A read past a
    revision a refused write proved is read again until it is past it."""
    first = await leases.put("behind", LeaseRecord("run", 1))
    old = await leases._read("behind")
    second = await leases.put("behind", LeaseRecord("done", 2))
    read = leases._read
    lagging = [old, old]  # a replica behind answers twice

    async def from_a_replica(key: str, *, leader: bool = False):  # type: ignore[no-untyped-def]
        return lagging.pop() if lagging else await read(key)

    monkeypatch.setattr(leases, "_read", from_a_replica)
    entry = await leases.last("behind", after=first)
    assert entry is not None and (entry.revision, entry.value.holder) == (second, "done")
    lagging.append(old)
    plain = await leases.last("behind")  # nothing proved: what was read
    assert plain is not None and plain.revision == first


async def test_nothing_to_change_is_confirmed_with_the_streams_leader(leases, monkeypatch):
    """A direct get answered by a replica behind (a node paused) showed a workflow's step
    not yet running, the change found nothing to do, and the step's result was dropped:
    with ``confirm``, "nothing to change" is decided on the leader's value."""
    await leases.put("paused", LeaseRecord("before", 1))
    old = await leases._read("paused")
    current = await leases.put("paused", LeaseRecord("after", 2))
    read = leases._read

    async def from_a_replica(key: str, *, leader: bool = False):  # type: ignore[no-untyped-def]
        return await read(key, leader=True) if leader else old

    monkeypatch.setattr(leases, "_read", from_a_replica)

    def only_after(held: LeaseRecord | None) -> LeaseRecord | None:
        return LeaseRecord("changed", 3) if held is not None and held.holder == "after" else None

    assert not (await leases.cas("paused", only_after)).written  # the replica's view alone
    swap = await leases.cas("paused", only_after, confirm=True)
    assert swap.written and swap.entry is not None and swap.entry.revision > current
    assert (await leases.get("paused", leader=True)).value.holder == "changed"  # type: ignore[union-attr]
