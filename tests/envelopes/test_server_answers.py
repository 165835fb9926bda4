"""What the agent protocol says a reader may rely on: a server's JSON told by its first bytes,
and the headers an event carries (protocol §6, §12.1)."""

from __future__ import annotations

from agentreach.broker.lifecycle import event_for, event_message
from agentreach.broker.names import Names
from agentreach.envelopes import Task
from agentreach.envelopes.server_answers import server_answer


def test_a_server_answer_is_told_from_its_first_byte_no_whitespace_skipped() -> None:
    """§6: the opening `{"type":"io.nats.` is matched from the body's first byte, as the
    server writes its compact JSON; with whitespace first the body is no server's answer
    (it is then decoded as a task, which it is not)."""
    body = b'{"type":"io.nats.jetstream.api.v1.stream_info_response","config":{}}'
    assert server_answer(body, {"X": "1"}) is not None
    assert server_answer(b" " + body, {"X": "1"}) is None
    assert server_answer(b'{"type": "io.nats.x"}', {"X": "1"}) is None  # not compact


class _Broker:
    names = Names()


def test_an_agents_events_carry_reach_kind_and_a_dedup_id_but_progress() -> None:
    """§12.1: the Python SDK puts `Reach-Kind: event` on every event, and `Nats-Msg-Id` on
    every one but `progress`; no other header."""
    task = Task(v=1, message_id="m-1", trace_id="t-1", topic="echo")
    sent = {
        name: event_message(_Broker(), event_for(task, name, agent_id="a-1"), sender="a-1")  # type: ignore[arg-type]
        for name in ("accepted", "completed", "progress")
    }
    assert sent["completed"].headers == {
        "Reach-Kind": "event",
        "Nats-Msg-Id": "m-1-completed-1-a-1",
    }
    assert set(sent["accepted"].headers) == {"Reach-Kind", "Nats-Msg-Id"}
    assert sent["progress"].headers == {"Reach-Kind": "event"}
