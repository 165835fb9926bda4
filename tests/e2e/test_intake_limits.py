"""What intake keeps of what it cannot take: an invalid body is dead-lettered cut down, and a
large body whose claim check keeps failing ends in a dead letter instead of coming back."""

from __future__ import annotations

import msgspec
import pytest

from agentreach.broker import read_stream
from agentreach.broker.dead_letters import RAW_KEPT
from agentreach.coordinator.intake import STOW_TRIES
from agentreach.envelopes import headers as h
from tests.secured import SECURED
from tests.support import until_true


async def test_a_large_invalid_body_is_dead_lettered_cut_down(broker, coordinator, watcher):
    """900 KB of malformed JSON leaves a letter with its first 64 Ki characters, marked
    truncated, not the whole body for the dead letters' 30 days."""
    body = b"{not json " + b"q" * 900_000
    await broker.publish(broker.names.task("summarize"), body, headers={h.MSG_ID: "bad-big"})
    letter = await watcher.dead_letter("invalid_envelope", message_id="bad-big")
    assert letter.truncated
    assert letter.raw is not None and letter.raw == body[:RAW_KEPT].decode()

    async def stored() -> list[int] | None:
        # A subscriber hears a letter as the stream takes it, maybe before it is stored.
        return [len(m.data) for m in await read_stream(broker, broker.names.dlq_stream, ">")]

    sizes = await until_true(stored, timeout=5)
    assert max(sizes) < 2 * RAW_KEPT


@pytest.mark.skipif(SECURED, reason="a secured deployment has no claim check")
async def test_a_claim_check_that_keeps_failing_ends_in_a_dead_letter(broker, coordinator, watcher):
    """With the payload store gone, a 300 KB `nats pub` body is tried STOW_TRIES times,
    then dead-lettered as rejected with the reason, never routed."""
    await broker.js.delete_stream(f"OBJ_{broker.names.payloads_bucket}")
    body = msgspec.json.encode({"text": "x" * 300_000})
    await broker.publish(broker.names.task("mirror"), body, headers={h.MSG_ID: "unstowed"})
    letter = await watcher.dead_letter("rejected", message_id="unstowed", timeout=30)
    assert letter.error is not None and letter.error.type == "claim_check_failed"
    assert f"{STOW_TRIES} tries" in letter.error.message
    assert "does not exist" in letter.error.message
    assert watcher.count("routed", {"unstowed"}) == 0
