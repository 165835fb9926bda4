"""A max-deliveries advisory about a dispatch: dead-lettered, or answered from the agent's
record when the run was done, but only for a dispatch the coordinator granted."""

from __future__ import annotations

import msgspec
from nats.aio.msg import Msg

from agentreach import envelopes
from agentreach.broker import Delivery
from agentreach.broker.lifecycle import GRANT_HEADER
from agentreach.coordinator.delivery.advisories import Advisories
from agentreach.coordinator.protection.grants import Grants
from tests.support import DISPATCHED, recorded


async def _advise(broker, advisories: Advisories, seq: int) -> None:  # type: ignore[no-untyped-def]
    """What nats-server says when the dispatch at ``seq`` was delivered 5 times."""
    stream = broker.names.dispatch_stream("P1")
    body = {"stream": stream, "consumer": "agent-mallory-p1", "stream_seq": seq, "deliveries": 5}
    msg = Msg(broker.nc, subject="$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.x.y", data=b"")
    msg.data = msgspec.json.encode(body)
    await advisories.handle(Delivery(msg))


async def test_a_dispatch_without_a_grant_is_answered_from_no_record(broker, watcher):
    """A task someone had the server copy onto its own queue (caller alice, her finished
    message, a reply box of the forger's), NAKed to its last delivery, was taken for the
    coordinator's: ended in alice's name, or answered from her record to the forger's box.
    It is dead-lettered as the bytes it is instead."""
    grants = Grants(b"k" * 32)
    await recorded(broker, "order-42", "bob", "done", result={"secret": 1}, caller="alice")
    forged = envelopes.Task(
        v=1, message_id="order-42", trace_id="order-42", topic="echo", caller="alice",
        attempt=2, reply_to=broker.names.reply_box("mallory", "loot"), to_agent="mallory",
    )  # fmt: skip
    queue = broker.names.dispatch("mallory", "P1")
    stored = await broker.publish(queue, envelopes.encode(forged), headers=DISPATCHED)
    await _advise(broker, Advisories(broker, grants), stored.seq)
    letter = await watcher.dead_letter("retries_exhausted")
    assert letter.raw is not None and "order-42" in letter.raw
    assert not [e for e in watcher.events if e.event == "answered_from_record"]

    granted = msgspec.structs.replace(forged, message_id="granted-1", trace_id="granted-1")
    grant = {GRANT_HEADER: grants.sign(granted, "mallory") or ""}
    stored = await broker.publish(queue, envelopes.encode(granted), headers={**DISPATCHED, **grant})
    await _advise(broker, Advisories(broker, grants), stored.seq)
    ended = await watcher.dead_letter("retries_exhausted", message_id="granted-1")
    assert ended.envelope is not None and ended.envelope.caller == "alice"
