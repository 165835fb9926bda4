"""Hypothesis strategy for full envelopes (``{"v": 1, "kind": "task", ...}``) with one
field missing, mistyped (each JSON type it does not take), out of range, or duplicated —
or none — and the verdict: the envelope's fields are checked, and the fault is named by
its JSON path (``$.ttl_ms``).
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from agentreach.envelopes import is_token
from tests.fuzz.bodies import SPACE, deep_documents, json_documents
from tests.fuzz.contract import (
    ANY_JSON_PATH,
    MAX_TTL_MS,
    OK,
    SURE_TTL_MS,
    TOPIC,
    Verdict,
    bad,
    combine,
    either,
    reply_verdict,
)
from tests.fuzz.headers import ids, milliseconds, reply_headers

_texts = st.text(max_size=20)
_SAMPLES = {  # a value of each JSON type, by type
    "str": ['"x"', '""'],
    "int": ["5", "-5"],
    "float": ["5.5", "5.0", "1e2"],
    "bool": ["true", "false"],
    "null": ["null"],
    "array": ["[]", '["task"]'],
    "object": ["{}", '{"a": 1}'],
}
# field: (JSON types it takes, required)
FIELDS: dict[str, tuple[frozenset[str], bool]] = {
    "v": (frozenset({"int"}), True),
    "kind": (frozenset({"str"}), True),
    "message_id": (frozenset({"str"}), True),
    "trace_id": (frozenset({"str"}), True),
    "topic": (frozenset({"str"}), True),
    "payload": (frozenset(_SAMPLES), False),
    "ttl_ms": (frozenset({"int"}), False),
    "reply_to": (frozenset({"str", "null"}), False),
    "priority": (frozenset({"str"}), False),
    "attempt": (frozenset({"int"}), False),
    "budget": (frozenset({"object"}), False),
    "from_agent": (frozenset({"str", "null"}), False),
    "to_agent": (frozenset({"str", "null"}), False),
    "created_at": (frozenset({"int"}), False),
    "replay_of": (frozenset({"str", "null"}), False),
    "headers": (frozenset({"object"}), False),
}
_OPTIONAL = [n for n, (_, required) in FIELDS.items() if not required and n != "payload"]
_BAD_TOKENS = ["a.b", "a b", "x" * 129, "", "*", ">", "é", "a\u0000b", "a\tb", "a>b", "fuzz.x"]
_HUGE = [str(MAX_TTL_MS + 1), str(10**13), str(2**63 - 1), str(2**64), str(10**23), "9" * 5000]
_OUT_OF_RANGE: dict[str, list[str]] = {
    "v": ["0", "2", "-1", str(10**20)],
    "kind": [json.dumps(k) for k in ["nope", "ack", "result", "event", "dead_letter", "Task", ""]],
    "message_id": [json.dumps(t) for t in _BAD_TOKENS],
    "trace_id": [json.dumps(t) for t in _BAD_TOKENS],
    "topic": [json.dumps(t) for t in ["other", "fuzz.x", "", "FUZZ", "*", "x" * 129]],
    "ttl_ms": ["0", "-1", str(-(2**63)), "1e400", *_HUGE],
    "priority": [json.dumps(p) for p in ["P9", "P3", "p0", "", " P0", "P0 ", "PO", "urgent"]],
    "attempt": ["0", "-1", str(-(2**63))],
    "budget": ['{"ack_ms": 0}', '{"seek_ms": -1}', '{"execute_ms": "x"}', '{"ack_ms": 1.5}'],
    "created_at": ["1e400", "-1e400"],
    "headers": ['{"a": 1}', '{"a": null}', '{"a": ["x"]}', '{"a": {"b": "c"}}'],
}
_MUTABLE = sorted(FIELDS)
_MISTYPED = {
    name: st.sampled_from([s for t in sorted(_SAMPLES) if t not in types for s in _SAMPLES[t]])
    for name, (types, _) in FIELDS.items()
    if name != "payload"
}
_RANGE = {name: st.sampled_from(values) for name, values in _OUT_OF_RANGE.items()}
_HOW = {
    name: st.sampled_from(
        ["missing", "mistyped"]
        + ["out_of_range"] * 2 * (name in _OUT_OF_RANGE or name in ("reply_to", "payload"))
    )
    for name in FIELDS
}


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


_VALID: dict[str, st.SearchStrategy[str]] = {
    "v": st.just("1"),
    "kind": st.just('"task"'),
    "message_id": ids.map(_dumps),
    "trace_id": ids.map(_dumps),
    "ttl_ms": milliseconds.map(str),
    "priority": st.sampled_from(['"P0"', '"P1"', '"P2"']),
    "attempt": st.integers(1, 1000).map(str),
    "budget": st.fixed_dictionaries(
        {}, optional={k: milliseconds for k in ("seek_ms", "ack_ms", "execute_ms")}
    ).map(_dumps),
    "from_agent": st.one_of(st.just("null"), _texts.map(_dumps)),
    "to_agent": st.one_of(st.just("null"), _texts.map(_dumps)),
    "created_at": st.integers(-(2**63), 2**64 - 1).map(str),
    "replay_of": st.one_of(st.just("null"), _texts.map(_dumps)),
    "headers": st.dictionaries(_texts, _texts, max_size=3).map(_dumps),
}
_FEW_OPTIONAL = st.lists(st.sampled_from(_OPTIONAL), max_size=len(_OPTIONAL))
_HOW_MANY = st.sampled_from(["none", "one", "one", "one", "unknown", "duplicate"])
_LONG_TTL = st.integers(SURE_TTL_MS + 1, MAX_TTL_MS)
_LONG_BUDGET = st.integers(SURE_TTL_MS + 1, 10**15)
_ANY_DOC = st.one_of(json_documents(), deep_documents())


def _mutation(draw: st.DrawFn, name: str) -> tuple[str | None, Verdict, str]:
    """A wrong value for field ``name`` (None: leave the field out) and its verdict."""
    path = f"$.{name}"
    how = draw(_HOW[name])
    if how == "missing":
        required = FIELDS[name][1]
        return None, (bad(path, f"{name} missing") if required else OK), f"{name} missing"
    if how == "mistyped":
        if name == "payload":  # it takes anything
            doc = draw(json_documents())
            return doc.text, doc.verdict, "payload of any type"
        text = draw(_MISTYPED[name])
        return text, bad(path, f"{name} mistyped as {text}"), f"{name} mistyped"
    return _out_of_range(draw, name)


def _out_of_range(draw: st.DrawFn, name: str) -> tuple[str, Verdict, str]:
    path = f"$.{name}"
    if name == "reply_to":
        subject = draw(reply_headers)
        verdict = reply_verdict(subject, path) if subject else either(path, "empty reply_to")
        return _dumps(subject), verdict, f"reply_to {subject[:40]!r}"
    if name == "payload":
        doc = draw(_ANY_DOC)
        return doc.text, doc.verdict, f"payload: {doc.verdict.why or 'JSON'}"
    if name == "ttl_ms" and draw(st.booleans()):
        ttl = draw(_LONG_TTL)
        return str(ttl), either(path, "long ttl"), f"ttl_ms {ttl}"
    if name == "budget" and draw(st.booleans()):
        ms = draw(_LONG_BUDGET)
        return _dumps({"execute_ms": ms}), either(path, "long budget"), f"budget {ms}"
    text = draw(_RANGE[name])
    return text, bad(path, f"{name} = {text[:40]}"), f"{name} out of range"


@st.composite
def envelopes(draw: st.DrawFn, topic: str = TOPIC) -> tuple[bytes, Verdict, str, bool, str | None]:
    """A full envelope with at most one field wrong: (body, verdict, note, is an envelope,
    the message_id it claims)."""
    present = {"v", "kind", "message_id", "trace_id", "topic", "payload", *draw(_FEW_OPTIONAL)}
    doc = draw(json_documents())
    fields = {n: draw(_VALID[n]) for n in sorted(present) if n in _VALID}
    fields["topic"], fields["payload"] = _dumps(topic), doc.text
    # The subject's topic is the envelope's; when it is no token, `$.topic` may be named.
    verdicts = {
        "payload": doc.verdict,
        "topic": OK if is_token(topic) else either("$.topic", "topic is no token"),
    }
    how = draw(_HOW_MANY)
    note, duplicate = "valid envelope", None
    if how == "one":
        name = draw(st.sampled_from(_MUTABLE))
        value, verdict, note = _mutation(draw, name)
        if name == "topic" and value == _dumps(topic):  # "other" on reach.task.other
            verdict = OK
        verdicts[name] = verdict
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = value
    elif how == "unknown":
        name = "x_" + draw(_texts)
        unknown = draw(_ANY_DOC)
        fields[name], note = unknown.text, "an unknown field"
        verdicts[name] = unknown.verdict
    elif how == "duplicate":
        name = draw(st.sampled_from(_MUTABLE))
        value, verdict, note = _mutation(draw, name)
        if value is not None:
            duplicate = (name, value, draw(st.booleans()))
            duplicated = combine(verdicts.get(name, OK), verdict, either(f"$.{name}", "duplicate"))
            verdicts[name] = duplicated.softened()
            note = f"duplicate {name}: {note}"
    order = draw(st.permutations(sorted(fields)))
    members = [f"{json.dumps(k)}: {fields[k]}" for k in order]
    if duplicate is not None:
        name, value, first = duplicate
        extra = f"{json.dumps(name)}: {value}"
        members = [extra, *members] if first else [*members, extra]
    sp = draw(SPACE)
    body = ("{" + sp + ("," + sp).join(members) + sp + "}").encode()
    claimed = json.loads(fields["message_id"]) if "message_id" in fields else None
    claimed = claimed if is_token(claimed) else None
    if "v" not in fields or "kind" not in fields:  # a bare body: its fields are payload,
        whole = [v for v in verdicts.values() if ANY_JSON_PATH in v.paths]  # only the document
        return body, combine(*whole), f"not an envelope: {note}", False, None
    return body, combine(*verdicts.values()), note, True, claimed
