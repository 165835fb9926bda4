"""Reading a stored message's position from its reply subject, as nats-py would."""

from __future__ import annotations

import nats.aio.msg
import nats.errors
import pytest

from agentreach.broker.watch import position


def _msg(reply: str) -> nats.aio.msg.Msg:
    return nats.aio.msg.Msg(_client=None, subject="$KV.b.k", reply=reply)  # type: ignore[arg-type]


def test_position_of_a_v1_reply_subject():
    msg = _msg("$JS.ACK.KV_b.watch.1.42.7.1764567890123456789.3")
    assert position(msg) == (42, 1764567890123, 3)
    assert position(msg)[0] == msg.metadata.sequence.stream
    assert position(msg)[2] == msg.metadata.num_pending


def test_position_of_a_v2_reply_subject_with_domain_and_account():
    msg = _msg("$JS.ACK.hub.ACCHASH.KV_b.watch.1.42.7.1764567890123456789.3.rand")
    assert position(msg) == (42, 1764567890123, 3)
    assert position(msg)[0] == msg.metadata.sequence.stream


def test_a_message_not_from_a_stream_is_refused():
    with pytest.raises(nats.errors.Error):
        position(_msg("_INBOX.abc.1"))
