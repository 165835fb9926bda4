"""A body that is not JSON is named as malformed JSON, however it is wrong."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"text": ', "JSON is malformed: truncated (the body ends before the value does)"),
        (b'{"text": x}', "JSON is malformed: invalid character (byte 9)"),
        (  # msgspec calls it truncated (a red team)
            b'{"text": "\\ud800"}',
            "JSON is malformed: a lone surrogate escape (\\ud800-\\udfff without its pair)"
            " is no character",
        ),
    ],
    ids=["truncated", "invalid-character", "lone-surrogate"],
)
async def test_a_malformed_body_is_dead_lettered_as_malformed_json(
    broker, coordinator, watcher, body, said
):
    """A body cut short says "JSON is malformed" as a bad character does (it said msgspec's
    "Input data was truncated", which does not say JSON). The letter keeps the subject it
    came on, which names its caller (nothing else in it does)."""
    subject = broker.names.task("summarize", "alice")
    await broker.publish(subject, body, headers={"Nats-Msg-Id": "cut-1"})
    letter = await watcher.dead_letter("invalid_envelope", message_id="cut-1")
    assert letter.error is not None
    assert letter.error.message == f"{said} - at `$`"
    assert letter.headers["Reach-Subject"] == subject
