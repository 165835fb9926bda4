"""Hypothesis strategies for what may arrive on ``reach.task.<topic>``, each with its verdict.

:func:`cases` combines a body (:mod:`tests.fuzz.bodies`) or a full envelope
(:mod:`tests.fuzz.envelopes`) with headers (:mod:`tests.fuzz.headers`) on a subject into a
:class:`~tests.fuzz.contract.Case`; :func:`explicit_cases` are the inputs every run
includes (issue 11 names most of them); :func:`draw_cases` draws a seeded list of cases
outside a test, for the end-to-end test and ``bench/fuzz.py``.
"""

from __future__ import annotations

import json
import os
import secrets

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as with_seed
from hypothesis import strategies as st

from agentreach.envelopes import headers as h
from tests.fuzz.bodies import (
    MAX_PAYLOAD,
    bad_doc,
    bare_bodies,
    big_bodies,
    deep_document,
    odd_doc,
)
from tests.fuzz.contract import (
    ANY_JSON_PATH,
    OK,
    TOPIC,
    Case,
    Verdict,
    combine,
    either,
    topic_verdict,
    wire,
)
from tests.fuzz.envelopes import envelopes
from tests.fuzz.headers import (
    DESTRUCTIVE_REPLIES,
    MALFORMED_REPLIES,
    NAMESPACE_REPLIES,
    PRIORITY_GARBAGE,
    TTL_GARBAGE,
    intake_headers,
    tokens,
)

# One seed per run for every fuzz test (hypothesis's @seed); FUZZ_SEED=<n> repeats a run.
SEED = int(os.environ.get("FUZZ_SEED") or secrets.randbelow(2**32))

_BODIES = {True: bare_bodies(big=True), False: bare_bodies(big=False)}
_ENVELOPE_ONE_IN = st.integers(0, 2)


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    topics: st.SearchStrategy[str] | None = None,
    on_wire: bool = False,
    big: bool = True,
) -> Case:
    """One intake message: a bare body or an envelope, headers, a subject topic.

    ``on_wire``: the headers as NATS delivers them, and only what the test server can
    take without harm.
    """
    topic = draw(topics) if topics is not None else TOPIC
    headers = draw(intake_headers(on_wire=on_wire))
    if draw(_ENVELOPE_ONE_IN) == 0:
        body, verdict, note, envelope, claimed = draw(envelopes(topic))
    else:
        body, verdict, note = draw(_BODIES[big])
        envelope, claimed = False, None
    alone = combine(topic_verdict(topic), verdict)
    case = Case(body, {}, topic, alone, note, envelope, claimed, body_verdict=alone)
    return case.with_headers(headers)


@st.composite
def big_cases(draw: st.DrawFn, *, on_wire: bool = False) -> Case:
    """A body near the 1 MiB payload limit (see :func:`big_bodies`), with any headers."""
    body, verdict, note = draw(big_bodies())
    case = Case(body, {}, TOPIC, verdict, note, body_verdict=verdict)
    return case.with_headers(draw(intake_headers(on_wire=on_wire)))


def pure_topics() -> st.SearchStrategy[str]:
    """Mostly the served topic; now and then what a subject's tail can also be."""
    odd = st.sampled_from(["a.b", "x" * 129, "é", "*", ">", "a b", "other", "reach.task.x"])
    return st.one_of(st.just(TOPIC), st.just(TOPIC), st.just(TOPIC), tokens, odd)


def wire_topics() -> st.SearchStrategy[str]:
    """Served, unserved (no_route) and multi-token (invalid) topics of a real subject
    (``reach.task.<topic>.<sender>`` is the sender form, so an invalid one has three)."""
    return st.sampled_from([TOPIC] * 8 + ["nobody", "a.b.c"])


def explicit_cases(*, on_wire: bool = False) -> list[Case]:
    """Inputs every run includes: the ones issue 11 names, and the edges of each rule."""
    found: list[Case] = []

    def add(body: bytes, headers: dict[str, str], verdict: Verdict, note: str) -> None:
        case = Case(body, {}, TOPIC, verdict, note, body_verdict=verdict)
        found.append(case.with_headers(wire(headers) if on_wire else headers))

    for depth in (999, 1000, 10_000, 100_000):
        for shape in ("array", "object"):
            doc = deep_document(depth, shape)
            add(doc.text.encode(), {}, doc.verdict, doc.verdict.why)
    envelope = {"v": 1, "kind": "task", "message_id": "m1", "trace_id": "t1", "topic": TOPIC}
    deep = deep_document(10_000, "array").text
    found.append(
        Case(
            json.dumps(envelope)[:-1].encode() + b', "payload": ' + deep.encode() + b"}",
            {},
            TOPIC,
            either(ANY_JSON_PATH, "payload nested 10000 deep"),
            "envelope with a payload nested 10,000 deep",
            envelope=True,
            claimed_id="m1",
            body_verdict=either(ANY_JSON_PATH, "payload nested 10000 deep"),
        )
    )
    for ttl in TTL_GARBAGE:
        add(b"{}", {h.TTL: ttl}, OK, f"Reach-TTL {ttl[:30]!r}")
    for subject in NAMESPACE_REPLIES + MALFORMED_REPLIES + ([] if on_wire else DESTRUCTIVE_REPLIES):
        add(b"{}", {h.REPLY_TO: subject}, OK, f"Reach-Reply-To {subject[:30]!r}")
    for priority in PRIORITY_GARBAGE:
        add(b"{}", {h.PRIORITY: priority}, OK, f"Reach-Priority {priority!r}")
    add(b"NaN", {}, bad_doc("NaN"), "NaN body")
    add(b"[Infinity]", {}, bad_doc("Infinity"), "Infinity in a body")
    add(b"9" * 5000, {}, odd_doc("5000 digits"), "a 5000-digit number")
    add(b'{"a": 1e400}', {}, odd_doc("1e400"), "1e400 in a body")
    add(b"\x01" * 200_000, {}, bad_doc("control bytes"), "200,000 raw control bytes")
    add(b"\xff" * 800_000, {}, bad_doc("not UTF-8"), "800,000 bytes of 0xff")
    add(b'"' + b"a" * (MAX_PAYLOAD - 200) + b'"', {}, OK, "a JSON string just under 1 MiB")
    return found


def trap_cases(*, on_wire: bool = False) -> list[Case]:
    """Valid tasks whose custom headers are names NATS clients give a meaning of their own:
    nats-py takes any message with a ``Status`` header for a JetStream status message. A
    run publishes them last: when they stall intake, the rest has been judged already."""
    found = []
    for headers in ({"Status": "500"}, {"Status": "404"}, {"Status": "100"}, {"Description": "x"}):
        case = Case(b"{}", {}, TOPIC, OK, f"custom header {headers}", body_verdict=OK)
        found.append(case.with_headers(wire(headers) if on_wire else headers))
    return found


def draw_cases(strategy: st.SearchStrategy[Case], count: int, seed: int) -> list[Case]:
    """``count`` cases from ``strategy``, the same ones for the same seed."""
    drawn: list[Case] = []

    @with_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )
    @given(strategy)
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    return drawn
