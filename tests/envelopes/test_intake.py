"""Wrapping what `nats pub` sends into a task, from headers and defaults."""

from __future__ import annotations

import msgspec
import pytest

from agentreach.envelopes import DecodeError, task_from_intake
from agentreach.envelopes import headers as h


def intake(
    data: bytes,
    headers: dict[str, str] | None = None,
    topic: str = "summarize",
    reply_allowed=None,  # type: ignore[no-untyped-def]
):
    return task_from_intake(
        data,
        headers,
        topic=topic,
        received_ms=1_000,
        fallback_id="gen-1",
        reply_allowed=reply_allowed,
    )


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
        ({h.TTL: " 5"}, "summarize", "header Reach-TTL"),
        ({h.TTL: "1e3"}, "summarize", "header Reach-TTL"),
        ({h.TTL: "99999999999999999999999"}, "summarize", "header Reach-TTL"),
        ({h.REPLY_TO: "_INBOX.a b"}, "summarize", "header Reach-Reply-To"),
        ({h.REPLY_TO: "_INBOX.>"}, "summarize", "header Reach-Reply-To"),
        ({h.REPLY_TO: "$SYS.REQ.SERVER.PING"}, "summarize", "header Reach-Reply-To"),
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


def test_a_reply_subject_too_long_is_said_to_be_too_long():
    """A 300-character box was refused as "not one NATS subject", naming no length."""
    too_long = "reach.reply.alice." + "b" * 300
    with pytest.raises(DecodeError) as caught:
        intake(b"{}", {h.REPLY_TO: too_long})
    said = "Expected a subject of at most 256 characters, got 318 - at `header Reach-Reply-To`"
    assert str(caught.value) == said


def test_an_envelope_without_its_kind_is_refused_and_a_body_with_one_of_the_two_is_wrapped():
    """`v` and `message_id` without `kind` is an envelope that forgot it: taken as a bare
    body, its reply_to and ids went unread and its sender heard nothing (an outside caller
    trial). A payload with only one of the two is still a bare body."""
    forgot = b'{"v": 1, "message_id": "e1", "trace_id": "t", "topic": "summarize", "reply_to": "x"}'
    with pytest.raises(DecodeError) as caught:
        intake(forgot)
    assert caught.value.path == "$" and "missing required field `kind`" in str(caught.value)
    for body in (b'{"v": 2, "text": "hi"}', b'{"message_id": "<a@b>", "text": "hi"}'):
        assert intake(body).payload == msgspec.json.decode(body)


def test_envelope_topic_must_match_subject():
    """An envelope published on another topic's subject is refused at $.topic."""
    with pytest.raises(DecodeError) as caught:
        intake(b'{"v": 1, "kind": "task", "message_id": "e1", "trace_id": "t", "topic": "other"}')
    assert caught.value.path == "$.topic"


def test_replies_into_our_own_namespace_are_refused_but_workflow_replies_pass():
    """The coordinator's policy: no reply into reach.* except a workflow's reply subject."""
    from agentreach.broker import Names

    policy = Names().reply_allowed
    for bad in ("reach.dlq.x.y", "reach.task.t", "reach.event.a.b.c.d"):
        with pytest.raises(DecodeError) as caught:
            intake(b"{}", {h.REPLY_TO: bad}, reply_allowed=policy)
        assert caught.value.path == "header Reach-Reply-To"
    ok = intake(b"{}", {h.REPLY_TO: "reach.wf.reply.i1"}, reply_allowed=policy)
    assert ok.reply_to == "reach.wf.reply.i1"
    assert intake(b"{}", {h.REPLY_TO: "_INBOX.abc"}, reply_allowed=policy).reply_to == "_INBOX.abc"


def test_a_senders_resolution_is_dropped_whatever_its_shape():
    """Only the coordinator resolves (caller.md §5.1): a sender's is dropped, not judged;
    a made-up one was dead-lettered as a broken field."""
    body = b'{"kind": "task", "v": 1, "message_id": "r-1", "trace_id": "r-1", "topic": "summarize",'
    task = intake(body + b' "resolution": {"x": 1}}')
    assert task.resolution is None and task.message_id == "r-1"
