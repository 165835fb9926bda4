"""Wrapping what `nats pub` sends into a task, from headers and defaults."""

from __future__ import annotations

import pytest

from agentreach.envelopes import DecodeError, task_from_intake
from agentreach.envelopes import headers as h


def intake(data: bytes, headers: dict[str, str] | None = None, topic: str = "summarize"):
    return task_from_intake(data, headers, topic=topic, received_ms=1_000, fallback_id="gen-1")


def test_bare_body_takes_fields_from_headers():
    """Nats-Msg-Id, Reach-Trace-Id, Reach-Priority, Reach-TTL and Reach-Reply-To are used."""
    task = intake(
        b'{"text": "hi"}',
        {
            h.MSG_ID: "op-1",
            h.TRACE_ID: "tr-1",
            h.PRIORITY: "p0",
            h.TTL: "500",
            h.REPLY_TO: "_INBOX.x",
        },
    )
    assert (task.message_id, task.trace_id, task.priority, task.ttl_ms, task.reply_to) == (
        "op-1",
        "tr-1",
        "P0",
        500,
        "_INBOX.x",
    )
    assert task.payload == {"text": "hi"}
    assert task.topic == "summarize"
    assert task.created_at == 1_000


def test_bare_body_without_headers_gets_defaults():
    """No headers: the fallback id, trace = message id, P1, 30 s."""
    task = intake(b"[1, 2, 3]")
    assert (task.message_id, task.trace_id, task.priority, task.ttl_ms) == (
        "gen-1",
        "gen-1",
        "P1",
        30_000,
    )
    assert task.payload == [1, 2, 3]


def test_an_object_with_v_and_kind_is_an_envelope():
    """A full envelope is decoded strictly, not wrapped."""
    document = b'{"v": 1, "kind": "task", "message_id": "e1", "trace_id": "t", "topic": "summarize"'
    task = intake(document + b', "payload": {"a": 1}}')
    assert task.message_id == "e1" and task.payload == {"a": 1}


@pytest.mark.parametrize(
    ("headers", "topic", "path"),
    [
        ({h.TTL: "soon"}, "summarize", "header Reach-TTL"),
        ({h.TTL: "-5"}, "summarize", "header Reach-TTL"),
        ({h.PRIORITY: "urgent"}, "summarize", "header Reach-Priority"),
        ({h.MSG_ID: "has space"}, "summarize", "header Nats-Msg-Id"),
        ({}, "a.b", "subject topic"),
    ],
)
def test_bad_headers_name_the_header(headers, topic, path):
    """A header that cannot be used is an error naming that header."""
    with pytest.raises(DecodeError) as caught:
        intake(b"{}", headers, topic=topic)
    assert caught.value.path == path


def test_envelope_topic_must_match_subject():
    """An envelope published on another topic's subject is refused at $.topic."""
    with pytest.raises(DecodeError) as caught:
        intake(b'{"v": 1, "kind": "task", "message_id": "e1", "trace_id": "t", "topic": "other"}')
    assert caught.value.path == "$.topic"
