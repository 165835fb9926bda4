"""Sealed buckets: a record a replica reads is one a replica wrote. Anyone may have the NATS
server write its answer to a request onto a key (a direct get of content they chose, a
delete marker of their own), and read back by a direct get it shows nothing of that."""

from __future__ import annotations

import pytest

from agentreach.broker import Bucket, Entry
from agentreach.broker.record_seal import RECORD_SEAL, RecordSeal
from agentreach.broker.streams import last_message
from agentreach.envelopes import DecodeError, LeaseRecord, encode
from tests.support import until_true

KEY = b"k" * 32


@pytest.fixture
async def sealed(broker) -> Bucket[LeaseRecord]:
    broker.record_seals[broker.names.leases_bucket] = RecordSeal(KEY)
    try:
        yield await broker.bucket(broker.names.leases_bucket, LeaseRecord)
    finally:
        broker.record_seals.clear()


def _subject(bucket: Bucket[LeaseRecord], key: str) -> str:
    return f"$KV.{bucket.name}.{key}"


async def test_what_a_replica_writes_reads_back_and_a_forgery_does_not(broker, sealed):
    """A record written without the seal (here as a party's own message, which is what the
    server's answer aimed at the key is) reads as unreadable, naming why."""
    await sealed.put("duty", LeaseRecord("replica-1", 1))
    entry = await sealed.get("duty")
    assert entry is not None and entry.value == LeaseRecord("replica-1", 1)
    forged = encode(LeaseRecord("mallory", 2**50))
    await broker.publish(_subject(sealed, "duty"), forged)
    with pytest.raises(DecodeError, match=r"duty \(revision \d+\) holds a record without the seal"):
        await sealed.get("duty")
    assert await sealed.snapshot() == {}


async def test_a_seal_is_of_its_key_and_its_content(broker, sealed):
    """A sealed record copied onto another key, or its seal on other content, is refused."""
    await sealed.put("a", LeaseRecord("replica-1", 1))
    stored = await broker.js.get_msg(f"KV_{sealed.name}", subject=_subject(sealed, "a"))
    seal = {RECORD_SEAL: stored.headers[RECORD_SEAL]}
    await broker.publish(_subject(sealed, "b"), stored.data, headers=seal)
    await broker.publish(_subject(sealed, "a"), encode(LeaseRecord("x", 9)), headers=seal)
    for key in ("a", "b"):
        with pytest.raises(DecodeError, match="without the seal"):
            await sealed.get(key)


async def test_cas_replaces_a_forgery_from_what_it_is_told_to_take_instead(broker, sealed):
    """cas hands ``change`` the ``unreadable`` stand-in, never the forged value."""
    await sealed.put("duty", LeaseRecord("replica-1", 1))
    await broker.publish(_subject(sealed, "duty"), encode(LeaseRecord("mallory", 2**50)))
    seen: list[LeaseRecord | None] = []

    def renew(current: LeaseRecord | None) -> LeaseRecord:
        seen.append(current)
        return LeaseRecord("replica-1", 2)

    swap = await sealed.cas("duty", renew, unreadable=lambda: LeaseRecord("kept", 1))
    assert swap.written and seen == [LeaseRecord("kept", 1)]
    entry = await sealed.get("duty")
    assert entry is not None and entry.value == LeaseRecord("replica-1", 2)


async def test_a_forged_delete_marker_is_no_delete(broker, sealed):
    """A delete marker a party wrote (a quota record read as deleted is a fresh quota) is
    unreadable; a replica's own delete is a delete, and the key can be created again."""
    await sealed.put("quota", LeaseRecord("replica-1", 1))
    await broker.publish(_subject(sealed, "quota"), b"", headers={"KV-Operation": "DEL"})
    with pytest.raises(DecodeError, match="without the seal"):
        await sealed.get("quota")
    swap = await sealed.cas("quota", lambda current: current, unreadable=lambda: None)
    assert not swap.written  # nothing to take instead: left as it is
    await sealed.delete("quota")
    assert await sealed.get("quota") is None
    await sealed.create("quota", LeaseRecord("replica-1", 3))
    assert (await sealed.get("quota")).value == LeaseRecord("replica-1", 3)


async def test_an_unsealed_bucket_reads_what_anyone_wrote(broker):
    """Without a seal key (an open server, everyone trusted) nothing is sealed or checked."""
    leases = await broker.bucket(broker.names.leases_bucket, LeaseRecord)
    await broker.publish(f"$KV.{leases.name}.duty", encode(LeaseRecord("anyone", 1)))
    entry = await leases.get("duty")
    assert entry is not None and entry.value == LeaseRecord("anyone", 1)
    stored = await broker.js.get_msg(f"KV_{leases.name}", subject=f"$KV.{leases.name}.duty")
    assert RECORD_SEAL not in (stored.headers or {})


async def test_a_direct_get_answer_aimed_at_a_key_is_unreadable_in_any_bucket(broker):
    """Read by a direct get, a stored direct get's answer has the server's headers after its
    own: the client marks it, and no bucket takes it for a record, sealed or not."""
    leases = await broker.bucket(broker.names.leases_bucket, LeaseRecord)
    own = f"$KV.{broker.names.executions_bucket}.x.t.mallory"
    await broker.publish(own, encode(LeaseRecord("mallory", 2**50)))
    direct = f"$JS.API.DIRECT.GET.KV_{broker.names.executions_bucket}.{own}"
    await broker.nc.publish(direct, b"", reply=f"$KV.{leases.name}.duty")
    await until_true(lambda: _stored(broker, f"$KV.{leases.name}.duty"))
    with pytest.raises(DecodeError, match=r"duty \(revision \d+\) holds a JetStream direct get's"):
        await leases.get("duty")
    assert await leases.snapshot() == {}


async def _stored(broker, subject: str) -> bool:  # type: ignore[no-untyped-def]
    return await last_message(broker, f"KV_{broker.names.leases_bucket}", subject) is not None


@pytest.fixture
async def kept(broker) -> Bucket[LeaseRecord]:
    """A sealed bucket that keeps 5 revisions of a key (as reach_workflows does)."""
    broker.record_seals[broker.names.workflows_bucket] = RecordSeal(KEY)
    try:
        yield await broker.bucket(broker.names.workflows_bucket, LeaseRecord)
    finally:
        broker.record_seals.clear()


async def test_a_forgery_hides_nothing_the_bucket_still_keeps(broker, kept):
    """Read, listed or changed, the key is the last record a replica wrote (a running
    workflow's, after a coordinator restart, was lost); the write is at the forged revision."""
    await kept.put("wf-1", LeaseRecord("replica-1", 1))
    await kept.put("wf-1", LeaseRecord("replica-1", 2))
    forged_at = await broker.publish(_subject(kept, "wf-1"), encode(LeaseRecord("mallory", 9)))
    entry = await kept.get("wf-1")
    assert entry == Entry("wf-1", LeaseRecord("replica-1", 2), forged_at.seq)
    assert (await kept.snapshot())["wf-1"].value == LeaseRecord("replica-1", 2)
    seen: list[LeaseRecord | None] = []

    def renew(current: LeaseRecord | None) -> LeaseRecord:
        seen.append(current)
        return LeaseRecord("replica-1", 3)

    assert (await kept.cas("wf-1", renew)).written
    assert seen == [LeaseRecord("replica-1", 2)]


async def test_past_what_the_bucket_keeps_a_forged_key_stays_unreadable(broker, kept):
    await kept.put("wf-2", LeaseRecord("replica-1", 1))
    for n in range(5):  # the bucket's 5 revisions, every one forged
        await broker.publish(_subject(kept, "wf-2"), encode(LeaseRecord("mallory", n)))
    with pytest.raises(DecodeError, match="without the seal"):
        await kept.get("wf-2")
    assert await kept.snapshot() == {}
