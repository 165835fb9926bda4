"""Hypothesis strategies for bodies, each with its verdict as a whole JSON document.

- :func:`json_documents`: JSON text of any shape, with odd literals (huge numbers, ``-0``,
  ``1e400``, lone surrogate escapes), duplicate keys, and ``NaN`` / ``Infinity``;
- :func:`deep_documents`: nesting 10,000 levels deep and more, and around the recursion limit;
- :func:`bare_bodies`: all of these, plus non-UTF-8, malformed JSON, arbitrary bytes and
  (:func:`big_bodies`) bodies near NATS's 1 MiB payload limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st

from tests.fuzz.contract import ANY_JSON_PATH, OK, Verdict, bad, combine, either

MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload


@dataclass(frozen=True)
class Json:
    """A JSON text fragment and its verdict when it is a whole document."""

    text: str
    verdict: Verdict = OK


def bad_doc(why: str) -> Verdict:
    """A fault of the document as a whole: an error at any JSON path must follow."""
    return bad(ANY_JSON_PATH, why)


def odd_doc(why: str) -> Verdict:
    """A document the contract lets the decoder accept or refuse (at any JSON path)."""
    return either(ANY_JSON_PATH, why)


# -- JSON text ---------------------------------------------------------------------------

SPACE = st.sampled_from(["", "", " ", "\n", "\t", "\r\n  "])
_ODD_LITERALS = [
    *(Json(t) for t in ["-0", "0e0", "1E+2", "1.0e-5", "-9223372036854775809"]),
    *(Json(t) for t in ["18446744073709551616", "123456789012345678901234567890", '"\\u0000"']),
    *(Json(t) for t in ['"\\ud83d\\ude00"', '"\\/"', '"\\u00e9"', '"\\u2028"', '"\x7f"']),
    *(Json(t, odd_doc("number out of float range")) for t in ["1e400", "-1e400", "1e-400"]),
    *(Json(t, odd_doc("lone surrogate escape")) for t in ['"\\ud800"', '"\\udc00x"']),
    *(Json(t, bad_doc("NaN / Infinity literal")) for t in ["NaN", "Infinity", "-Infinity"]),
    *(Json(t, bad_doc("not a JSON number")) for t in ["nan", "inf", "01", "1.", ".5", "+1"]),
    *(Json(t, bad_doc("not a JSON literal")) for t in ["0x10", "1e", "--1", "True", "None"]),
    *(Json(t, bad_doc("not a JSON string")) for t in ['"\x01"', '"a\tb"', '"\\x41"', "'a'"]),
]
_scalars = st.one_of(
    st.sampled_from([Json("null"), Json("true"), Json("false")]),
    st.integers(-(2**70), 2**70).map(lambda n: Json(str(n))),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: Json(repr(x))),
    st.builds(
        lambda s, ascii_only: Json(json.dumps(s, ensure_ascii=ascii_only)),
        st.text(max_size=30),
        st.booleans(),
    ),
    st.sampled_from(_ODD_LITERALS),
    st.integers(300, 100_000).map(lambda n: Json("9" * n, odd_doc(f"{n}-digit integer"))),
)
# No key is "kind": an object with both `v` and `kind` at the top would be an envelope.
_keys = st.one_of(st.text(max_size=8), st.sampled_from(["a", "a", "v", "payload", "message_id"]))


@st.composite
def _arrays(draw: st.DrawFn, inner: st.SearchStrategy[Json]) -> Json:
    items, sp = draw(st.lists(inner, max_size=5)), draw(SPACE)
    text = "[" + sp + ("," + sp).join(i.text for i in items) + sp + "]"
    return Json(text, combine(*(i.verdict for i in items)))


@st.composite
def _objects(draw: st.DrawFn, inner: st.SearchStrategy[Json]) -> Json:
    pairs = draw(st.lists(st.tuples(_keys, inner), max_size=5))
    sp = draw(SPACE)
    text = "{" + ",".join(f"{sp}{json.dumps(k)}{sp}:{sp}{v.text}" for k, v in pairs) + sp + "}"
    keys = [k for k, _ in pairs]
    dup = [odd_doc("duplicate keys")] if len(set(keys)) < len(keys) else []
    return Json(text, combine(*(v.verdict for _, v in pairs), *dup))


_DOCUMENTS = st.recursive(_scalars, lambda inner: _arrays(inner) | _objects(inner), max_leaves=16)


def json_documents() -> st.SearchStrategy[Json]:
    """JSON text of any shape, a few levels deep, with odd and invalid literals mixed in."""
    return _DOCUMENTS


def deep_document(depth: int, shape: str) -> Json:
    """JSON nested ``depth`` levels: arrays, objects, or both in turn."""
    if shape == "array":
        text = "[" * depth + "]" * depth
    elif shape == "object":
        text = '{"a":' * depth + "0" + "}" * depth
    else:
        half = max(depth // 2, 1)
        text = '[{"a":' * half + "1" + "}]" * half
    return Json(text, odd_doc(f"nested {depth} deep ({shape})"))


_DEEP = st.builds(
    deep_document,
    st.one_of(
        st.sampled_from([500, 900, 990, 999, 1000, 1001, 2000, 10_000, 100_000]),
        st.integers(2, 3000),
        st.integers(3000, 30_000),
    ),
    st.sampled_from(["array", "object", "mixed"]),
)


def deep_documents() -> st.SearchStrategy[Json]:
    """Deep nesting; 10,000 levels (issue 11) and the interpreter's recursion limit included."""
    return _DEEP


# -- bare bodies -------------------------------------------------------------------------

_INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]


@st.composite
def _non_utf8(draw: st.DrawFn) -> tuple[bytes, Verdict, str]:
    junk = draw(st.sampled_from([*_INVALID_UTF8, b"\xe2\x82"]))
    before, after = draw(st.text(max_size=10)), draw(st.text(max_size=10))
    inside = json.dumps(before)[:-1].encode() + junk + json.dumps(after)[1:].encode()
    body = draw(st.sampled_from([inside, b'{"text": ' + inside + b"}", junk]))
    return body, bad_doc("not UTF-8"), f"non-UTF-8 {junk!r}"


@st.composite
def _malformed(draw: st.DrawFn) -> tuple[bytes, Verdict, str]:
    doc = draw(json_documents())
    how = draw(st.sampled_from(["trailing", "truncated", "bom", "empty", "spaces"]))
    if how == "trailing":
        tail = draw(st.sampled_from([" x", "}", ",", "]"]))
        return (doc.text + tail).encode(), bad_doc("trailing characters"), "trailing characters"
    if how == "truncated":
        cut = draw(st.integers(0, max(len(doc.text) - 1, 0)))
        return doc.text[:cut].encode(), odd_doc("truncated JSON"), "truncated JSON"
    if how == "bom":
        return b"\xef\xbb\xbf" + doc.text.encode(), odd_doc("byte order mark"), "BOM + JSON"
    body = b"" if how == "empty" else draw(st.sampled_from([b" ", b"\n", b"\t\r\n"]))
    return body, odd_doc("no JSON at all"), "empty body"


def big_bodies() -> st.SearchStrategy[tuple[bytes, Verdict, str]]:
    """Bodies up to NATS's 1 MiB payload limit, some of which grow when dead-lettered."""
    return st.one_of(
        st.integers(100_000, MAX_PAYLOAD - 4096).map(
            lambda n: (b'"' + b"a" * n + b'"', OK, f"JSON string of {n} bytes")
        ),
        st.integers(20_000, 170_000).map(
            lambda n: (b'"' + b"\\u0001" * n + b'"', OK, f"{n} escaped control characters")
        ),
        st.integers(10_000, 400_000).map(
            lambda n: (b"\x01" * n, bad_doc("control bytes"), f"{n} raw control bytes")
        ),
        st.integers(100_000, MAX_PAYLOAD - 4096).map(
            lambda n: (b"\xff" * n, bad_doc("not UTF-8"), f"{n} bytes of 0xff")
        ),
    )


def bare_bodies(*, big: bool = True) -> st.SearchStrategy[tuple[bytes, Verdict, str]]:
    """What ``nats pub`` may send as a body, with its verdict as a whole document."""
    sized = [big_bodies()] if big else []
    return st.one_of(
        json_documents().map(lambda d: (d.text.encode(), d.verdict, "JSON")),
        json_documents().map(lambda d: (d.text.encode(), d.verdict, "JSON")),
        deep_documents().map(lambda d: (d.text.encode(), d.verdict, d.verdict.why)),
        _non_utf8(),
        _malformed(),
        st.binary(max_size=256).map(lambda b: (b, odd_doc("arbitrary bytes"), "bytes")),
        *sized,
    )
