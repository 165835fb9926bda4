"""Headers of a stored message, read back by sequence, by subject or from the stream's leader
(`STREAM.MSG.GET`), parsed as every other read parses them. nats-py parses that answer's
header block as an e-mail's, which ends at the first blank line: an agent staged a forged
task under a key of its own with a blank line inside its block, and had a direct get copy it
(the server adds Nats-Stream, Nats-Subject, … after the stored block) onto its own queue.
The coordinator's read by sequence saw none of the added headers and moved the forgery on as
its own task, in another caller's name (a security re-test)."""

from __future__ import annotations

import pytest

from agentreach.broker.streams import get_message, last_message, leader_message, next_message
from agentreach.envelopes import server_answer
from tests.support import until_true

BLOCKS = [
    b"NATS/1.0\r\nReach-Kind: task\r\n\r\nX-Pad: y\r\n\r\n",
    b"NATS/1.0\r\nReach-Kind: task\r\n\n\nX-Pad: y\r\n\r\n",
]


@pytest.mark.parametrize("block", BLOCKS, ids=["a blank line", "bare line feeds"])
async def test_a_copy_staged_with_a_blank_line_is_told_by_every_read(broker, block: bytes):
    bucket = broker.names.executions_bucket
    stream, own = f"KV_{bucket}", f"$KV.{bucket}.x.staged.mallory"
    target = f"$KV.{bucket}.x.target.bob"
    await broker.publish_header_block(own, block, b'{"forged": true}')
    await broker.nc.publish(f"$JS.API.DIRECT.GET.{stream}.{own}", b"", reply=target)

    async def copied():  # type: ignore[no-untyped-def]
        return await leader_message(broker, stream, target)

    stored = await until_true(copied)
    reads = [
        stored,
        await get_message(broker, stream, stored.stream_seq),
        await next_message(broker, stream, target),
        await last_message(broker, stream, target),
    ]
    for read in reads:
        assert read is not None and read.data == b'{"forged": true}'
        said = server_answer(read.data, read.headers)
        assert said is not None and "direct get's answer" in said, read.headers
