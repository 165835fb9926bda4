"""A caller's reply box drops a reply with no headers at all, and only that (caller.md §6.3)."""

from __future__ import annotations

from dataclasses import dataclass, field

from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.broker.names import COORDINATOR, Names
from agentreach.broker.reply_box import ReplyBox
from agentreach.envelopes import Result


@dataclass
class Message:
    subject: str
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _result(box: ReplyBox, headers: dict[str, str]) -> Message:
    body = Result(v=1, message_id="m-1", trace_id="m-1", topic="t", result={"ok": 1})
    return Message(f"{box.subject}.{COORDINATOR}", envelopes.encode(body), headers)


def test_a_reply_without_headers_is_dropped_and_one_with_any_header_kept() -> None:
    """caller.md §6.3 step 1 as the ReplyBox does it: no headers at all, from any sender (the
    coordinator's token included), is a server's answer and dropped; a reply with some header,
    though not Reach-Kind or Reach-Trace-Id, is not dropped for that."""
    box = ReplyBox(Names(), "alice", "b1")
    with capture_logs() as logs:
        box.collect(_result(box, {}))  # type: ignore[arg-type]
    assert box.replies.empty()
    assert [e["event"] for e in logs] == ["reply without headers dropped"]
    box.collect(_result(box, {"X-Other": "1"}))  # type: ignore[arg-type]
    assert box.replies.get_nowait().result == {"ok": 1}
