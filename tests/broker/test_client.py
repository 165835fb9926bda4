"""The Broker's nats-py client: headers read as nats-py reads them, faster."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NatsPyClient

from agentreach.broker import Broker, listen
from agentreach.broker.client import Client

# Names and values with what trips a parser: white space of every kind (\x1c-\x1f count
# as white space to Python), colons, non-ASCII and invalid UTF-8, empty parts.
_pieces = st.sampled_from(
    [b"", b" ", b"\t", b"\x0b", b"\x1c", b"\x1f", b":", b"a", b"Nats-Msg-Id", b"\xc3\xa9",
     b"\xff", b"x y", b"Reach-Trace-Id", b"01a2-b3"]
)  # fmt: skip
_text = st.lists(_pieces, max_size=6).map(b"".join)
_lines = st.lists(st.tuples(_text, st.sampled_from([b": ", b":", b""]), _text), max_size=6)


@given(_lines)
@settings(max_examples=500)
def test_a_header_block_parses_exactly_as_nats_py_parses_it(lines):
    raw = b"\r\n".join(name + sep + value for name, sep, value in lines) + b"\r\n\r\n"
    assert Client._parse_header_lines(raw) == NatsPyClient._parse_header_lines(raw)


async def test_headers_arrive_through_nats_as_they_were_sent(broker: Broker):
    """A message's headers, read by the Broker's connection, are the ones published."""
    assert isinstance(broker.nc, Client)
    sent = {"Nats-Msg-Id": "m-1", "Reach-Trace-Id": "t-1", "Reach-Note": "été: yes"}
    arrived: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    listening = await listen(broker, "client.headers", lambda msg: arrived.set_result(msg.headers))
    await broker.nc.publish("client.headers", b"{}", headers=sent)
    assert await asyncio.wait_for(arrived, timeout=5) == sent
    await listening.close()
