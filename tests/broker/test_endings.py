"""Which request a message's events are of, for a caller sending its id again."""

from __future__ import annotations

import pytest

from agentreach.broker.endings import ReusedId, Sent, _same_request
from agentreach.envelopes import Event, summarize

FIRST = summarize({"order": 7}).sha256


def routed(attempt: int = 1, **detail: object) -> Event:
    return Event(
        v=1, message_id="order-7", trace_id="t", topic="refund", event="routed",
        attempt=attempt, detail=detail,
    )  # fmt: skip


def test_the_same_request_or_nothing_to_compare_with_passes():
    """Before the first routed event, from a coordinator that records no topic, or for a
    topic a rule routed elsewhere, nothing differs."""
    sent = Sent("auto", FIRST)
    assert _same_request([], sent) == []
    assert _same_request([routed(attempt=2, sent_topic="other")], sent)
    assert _same_request([routed()], sent)  # a coordinator before revision 20
    assert _same_request([routed(sent_topic="auto", input={"sha256": FIRST})], sent)
    assert _same_request([routed(sent_topic="x")], None)
    # The task as routed (a rule sent `auto` on to `refund`), met again in an agent's queue.
    assert _same_request([routed(sent_topic="auto", input={"sha256": FIRST})], Sent("refund"))
    assert _same_request([routed(sent_topic="auto", input={"sha256": "9" * 64})], Sent("auto"))


def test_another_topic_or_payload_under_the_id_is_another_request():
    with pytest.raises(ReusedId, match="which was sent on topic 'auto', this one on 'ship'"):
        _same_request([routed(sent_topic="auto", input={"sha256": FIRST})], Sent("ship", FIRST))
    other = summarize({"order": 8}).sha256
    with pytest.raises(ReusedId, match=rf"another payload \(SHA-256 {FIRST[:12]}…"):
        _same_request([routed(sent_topic="auto", input={"sha256": FIRST})], Sent("auto", other))
