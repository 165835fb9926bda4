"""Hypothesis strategies for the headers of an intake message.

``Nats-Msg-Id``, ``Reach-Trace-Id``, ``Reach-Priority``, ``Reach-TTL`` and ``Reach-Reply-To``
are each absent, valid, garbage (the values issue 11 names, and more) or arbitrary text;
other headers have arbitrary names and values within what NATS carries (no CR or LF).
"""

from __future__ import annotations

from hypothesis import strategies as st

from agentreach.envelopes import headers as h
from tests.fuzz.contract import MAX_TTL_MS, SURE_TTL_MS, TOPIC, wire

_TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
tokens = st.text(_TOKEN_CHARS, min_size=1, max_size=128)
# Wide integers rather than text: hypothesis repeats small texts, and a repeated id is
# (rightly) dropped as a duplicate by JetStream, which makes for a shorter run.
ids = st.one_of(
    st.integers(0, 2**64).map(lambda n: f"id-{n:x}"),
    st.integers(0, 2**64).map(lambda n: f"id-{n:x}"),
    st.text(_TOKEN_CHARS, min_size=6, max_size=40),
)
milliseconds = st.integers(1, SURE_TTL_MS)

# nats-py's header-name characters
_HEADER_NAME_CHARS = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CASE_HEADER = "X-Fuzz-Case"
_KNOWN = {n.lower() for n in (h.MSG_ID, h.TRACE_ID, h.PRIORITY, h.TTL, h.REPLY_TO, h.KIND)}
header_values = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=40
)
TTL_GARBAGE = [" 5", "5 ", "-1", "0", "99999999999999999999999", "1e3", "", "+5", "1_000"]
TTL_GARBAGE += ["\uff15", "\u0665", "0x10", "5.0", "NaN", "inf", "9" * 400, str(MAX_TTL_MS + 1)]
TTL_GARBAGE += [str(2**63), str(2**64), "1 000", "5ms", "0000000000000000005"]
PRIORITY_GARBAGE = ["P9", "P3", "", " P0", "P0 ", "urgent", "0", "\uff300", "P0\x00", "PO", "high"]
ID_GARBAGE = ["a.b", "a b", "x" * 129, "*", ">", "é", "a\tb", "reach.task.x", "a/b", ""]
# The same faults with a number in them, so that JetStream does not drop them as duplicates.
_NUMBERED_ID_GARBAGE = st.one_of(
    st.sampled_from(ID_GARBAGE),
    st.builds(
        str.format,
        st.sampled_from(["a.{}", "a {}", "x" * 129 + "{}", "*{}", "é{}", "a\t{}", "a/{}"]),
        st.integers(0, 2**64),
    ),
)
NAMESPACE_REPLIES = [
    "reach.dlq.x.y",
    "reach.dlq.invalid_envelope.fuzz",
    "reach.task.x",
    f"reach.task.{TOPIC}",
    "reach.agent.a.p0",
    "reach.agent.fuzz-agent.p1",
    "reach.event.completed.fuzz.t.m",
    "reach.ctl.register",
    "reach.wf.reply.x",
    "reach.>",
    "$JS.API.INFO",
    "$SYS.REQ.SERVER.PING",
]
# Subjects that would wreck the test server itself if a reply were ever sent there.
DESTRUCTIVE_REPLIES = ["$JS.API.STREAM.DELETE.REACH_DLQ", "$KV.reach_agents.fuzz-agent"]
MALFORMED_REPLIES = ["*", ">", "a.*", "a.>", "a b", " _INBOX.x", "_INBOX.x ", "a..b", ".a", "a."]
MALFORMED_REPLIES += ["a\tb", "é.x", "x" * 300, "reach", "a*b", "_INBOX.\x00"]
valid_replies = st.one_of(
    st.sampled_from(["_INBOX.abc", "_INBOX.abc.def", "replies", "client-1.r"]),
    st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=8, max_size=22).map(
        lambda t: "_INBOX." + t
    ),
)
bad_replies = st.sampled_from(NAMESPACE_REPLIES + MALFORMED_REPLIES)
reply_headers = st.one_of(valid_replies, bad_replies, header_values)


def _header(
    valid: st.SearchStrategy[str], garbage: list[str] | st.SearchStrategy[str]
) -> st.SearchStrategy[str | None]:
    """Absent 6 times in 10, valid 2, garbage 1, arbitrary 1: most messages keep some
    valid headers, so that valid bodies get through to the agent too."""
    wrong = st.sampled_from(garbage) if isinstance(garbage, list) else garbage
    options = [st.none()] * 6 + [valid] * 2 + [wrong, header_values]
    return st.integers(0, 9).flatmap(options.__getitem__)


_header_names = st.text(_HEADER_NAME_CHARS, min_size=1, max_size=24).filter(
    lambda n: n.lower() not in _KNOWN and n != CASE_HEADER
)
# JetStream acts on its own Nats-* headers (Nats-Expected-Stream, …) when it stores a message.
_wire_header_names = _header_names.filter(lambda n: not n.lower().startswith("nats-"))
_READ = {
    h.MSG_ID: _header(ids, _NUMBERED_ID_GARBAGE),
    h.TRACE_ID: _header(tokens, ID_GARBAGE),
    h.PRIORITY: _header(st.sampled_from(["P0", "P1", "P2", "p0", "p2"]), PRIORITY_GARBAGE),
    h.TTL: _header(milliseconds.map(str), TTL_GARBAGE),
}
_REPLY_ON_WIRE = _header(valid_replies, NAMESPACE_REPLIES + MALFORMED_REPLIES)
_REPLY_ANYWHERE = st.integers(0, 9).flatmap(
    ([_REPLY_ON_WIRE] * 9 + [st.sampled_from(DESTRUCTIVE_REPLIES)]).__getitem__
)
_CUSTOM = st.dictionaries(_header_names, header_values, max_size=3)
_CUSTOM_ON_WIRE = st.dictionaries(_wire_header_names, header_values, max_size=3)


@st.composite
def intake_headers(draw: st.DrawFn, *, on_wire: bool = False) -> dict[str, str]:
    """The headers intake reads, with valid, garbage or arbitrary values, and others."""
    chosen = {name: draw(values) for name, values in _READ.items()}
    chosen[h.REPLY_TO] = draw(_REPLY_ON_WIRE if on_wire else _REPLY_ANYWHERE)
    headers = {name: value for name, value in chosen.items() if value is not None}
    headers.update(draw(_CUSTOM_ON_WIRE if on_wire else _CUSTOM))
    return wire(headers) if on_wire else headers
