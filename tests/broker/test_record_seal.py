"""Sealed buckets: a record a replica reads is one a replica wrote. Anyone may have the NATS
server write its answer to a request onto a key (a direct get of content they chose, a
delete marker of their own), and read back by a direct get it shows nothing of that."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from agentreach.broker import Bucket, Entry
from agentreach.broker.record_seal import RECORD_SEAL, RecordSeal
from agentreach.broker.streams import last_message
from agentreach.envelopes import DecodeError, LeaseRecord, encode
from tests.support import put_value, until_true

KEY = b"k" * 32


@pytest.fixture
async def sealed(broker) -> AsyncIterator[Bucket[LeaseRecord]]:
    """A sealed bucket that keeps one revision of a key (as reach_leases does)."""
    async with _sealed(broker, broker.names.leases_bucket) as bucket:
        yield bucket


@pytest.fixture
async def kept(broker) -> AsyncIterator[Bucket[LeaseRecord]]:
    """A sealed bucket that keeps 5 revisions of a key (as reach_workflows does)."""
    async with _sealed(broker, broker.names.workflows_bucket) as bucket:
        yield bucket


@contextlib.asynccontextmanager
async def _sealed(broker, name: str) -> AsyncIterator[Bucket[LeaseRecord]]:  # type: ignore[no-untyped-def]
    broker.record_seals[name] = RecordSeal(KEY)
    try:
        yield await broker.bucket(name, LeaseRecord)
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
    await put_value(broker, leases.name, "duty", encode(LeaseRecord("anyone", 1)))
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


async def _raw_publish(broker, subject: str, header_block: bytes, body: bytes) -> None:  # type: ignore[no-untyped-def]
    """An HPUB with the header block as given, malformed or not (what any client may send)."""
    size = len(header_block)
    command = f"HPUB {subject} {size} {size + len(body)}\r\n".encode()
    await broker.nc._send_command(command + header_block + body + b"\r\n")
    await broker.nc.flush()


async def _aimed(broker, own: str, target: str) -> None:  # type: ignore[no-untyped-def]
    """Have the server write ``own``'s last message onto ``target`` (a direct get's answer)."""
    stream = f"KV_{broker.names.executions_bucket}"
    await broker.nc.publish(f"$JS.API.DIRECT.GET.{stream}.{own}", b"", reply=target)


@pytest.mark.parametrize(
    "block",
    [b"NATS/1.0\r\nY\r\n", b"NATS/1.0\r\nX: a\r\n", b"NATS/1.0\r\nX: 1\r\n\r\n"],
    ids=["a last line without a colon", "a block that ends early", "a well-formed block"],
)
async def test_a_direct_get_answer_is_told_whatever_header_block_it_was_staged_with(
    broker, kept, block: bytes
):
    """The server writes its Nats-Stream onto the staged block's last line: ended early, the
    block hid it (`YNats-Stream`, or the end of a value), and the answer passed for an
    agent's own write (a walkthrough: any intent allowed, a card marked stopped, a verdict
    quarantined). The other lines a direct get adds cannot be hidden."""
    own = f"$KV.{broker.names.executions_bucket}.x.t.mallory"
    await _raw_publish(broker, own, block, encode(LeaseRecord("mallory", 9)))
    await kept.put("wf-3", LeaseRecord("replica-1", 1))
    await _aimed(broker, own, _subject(kept, "wf-3"))
    await until_true(lambda: _holds(broker, kept, "wf-3", b"mallory"))
    assert (await kept.get("wf-3")).value == LeaseRecord("replica-1", 1)  # read past it
    async with kept.watch() as watch:
        [taken] = await watch.snapshot()
    assert (taken.key, taken.value) == ("wf-3", encode(LeaseRecord("replica-1", 1)))


async def test_a_delete_marker_a_direct_get_answered_with_deletes_nothing(broker, kept):
    """A delete marker of an agent's own key, aimed at a verdict: the verdict was dropped,
    and a dead agent routable again."""
    own = f"$KV.{broker.names.executions_bucket}.x.t.mallory"
    await broker.publish(own, b"", headers={"KV-Operation": "DEL"})
    await kept.put("wf-4", LeaseRecord("replica-1", 1))
    async with kept.watch() as watch:
        changes = aiter(watch)
        assert (await anext(changes)).value == encode(LeaseRecord("replica-1", 1))
        await _aimed(broker, own, _subject(kept, "wf-4"))
        seen = await anext(changes)
        marker = await last_message(broker, f"KV_{kept.name}", _subject(kept, "wf-4"))
    assert seen.value == encode(LeaseRecord("replica-1", 1))  # the marker: the value before
    assert marker is not None and marker.headers.get("KV-Operation") == "DEL"
    assert (await kept.get("wf-4")).value == LeaseRecord("replica-1", 1)


async def _holds(broker, bucket: Bucket[LeaseRecord], key: str, text: bytes) -> bool:  # type: ignore[no-untyped-def]
    stored = await last_message(broker, f"KV_{bucket.name}", _subject(bucket, key))
    return stored is not None and text in stored.data


async def test_values_not_taken_are_said_a_few_times_a_minute_whatever_their_keys(broker):
    """Bare copies aimed at a headed bucket under ever new keys (a re-test made 30): the
    watch's log says five of them a minute, not one line per key."""
    name = broker.names.agents_bucket
    broker.headed_buckets.add(name)
    try:
        cards = await broker.bucket(name, LeaseRecord)
        async with cards.watch() as watch:
            changes = aiter(watch)
            with capture_logs() as logs:
                for n in range(20):
                    await broker.publish(_subject(cards, f"ghost-{n}"), b"{}")
                await put_value(broker, name, "real", encode(LeaseRecord("bob", 1)))
                assert (await anext(changes)).key == "real"  # the copies were all seen
    finally:
        broker.headed_buckets.discard(name)
    said = [e for e in logs if e["event"].startswith("a value without headers not taken")]
    assert [e["key"] for e in said] == [f"ghost-{n}" for n in range(5)]
