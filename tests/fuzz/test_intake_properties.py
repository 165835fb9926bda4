"""The intake decoder on generated input: a sound task, or a DecodeError naming the fault."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings

from agentreach.envelopes import DecodeError
from tests.fuzz.bodies import bare_bodies
from tests.fuzz.contract import (
    TOPIC,
    Case,
    decode_intake,
    is_path,
    names_fault,
    task_violations,
)
from tests.fuzz.envelopes import envelopes
from tests.fuzz.headers import intake_headers
from tests.fuzz.strategies import SEED, cases, explicit_cases, pure_topics, trap_cases

FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
REPEAT = f"[FUZZ_SEED={SEED}]"


def check(case: Case) -> None:
    """Decode ``case`` and hold the outcome to the verdict of the contract."""
    try:
        task = decode_intake(case)
    except DecodeError as exc:
        assert is_path(exc.path), f"the error names no field or header: {exc} {REPEAT}"
        assert case.verdict.kind != "ok", f"a valid input was refused: {exc} {REPEAT}"
        assert names_fault(exc.path, str(exc), case.verdict.paths), (
            f"{exc} names {exc.path!r}, not {sorted(case.verdict.paths)} {REPEAT}"
        )
        return
    except Exception as exc:  # RecursionError, UnicodeError, OverflowError, …
        pytest.fail(f"{type(exc).__name__} escaped the decoder: {str(exc)[:200]} {REPEAT}")
    assert case.verdict.kind != "bad", f"accepted ({case.verdict.why}) as {task!r:.300} {REPEAT}"
    assert task_violations(task, case) == [], f"an unsound task {task!r:.300} {REPEAT}"


@seed(SEED)
@settings(FUZZ, max_examples=800)
@given(cases(topics=pure_topics()))
def test_any_intake_message_decodes_to_a_sound_task_or_names_its_fault(case):
    """Bare bodies and envelopes with any headers on any subject: a task or a path."""
    check(case)


@seed(SEED)
@settings(FUZZ, max_examples=600)
@given(bare_bodies(), intake_headers())
def test_bare_bodies_with_headers_are_wrapped_or_refused_by_path(body, headers):
    """Any bytes with Nats-Msg-Id / Reach-* headers: wrapped from the headers, or refused."""
    body, verdict, note = body
    check(Case(body, {}, TOPIC, verdict, note, body_verdict=verdict).with_headers(headers))


@seed(SEED)
@settings(FUZZ, max_examples=800)
@given(envelopes(), intake_headers())
def test_envelopes_with_one_field_wrong_are_refused_at_that_field(envelope, headers):
    """A full envelope with a field missing, mistyped or out of range names that field."""
    body, verdict, note, is_envelope, claimed = envelope
    case = Case(body, {}, TOPIC, verdict, note, is_envelope, claimed, body_verdict=verdict)
    check(case.with_headers(headers))


@pytest.mark.parametrize("case", explicit_cases() + trap_cases(), ids=lambda c: c.note[:50])
def test_named_inputs_decode_to_a_sound_task_or_name_their_fault(case):
    """The inputs issue 11 names (depth 10,000, garbage Reach-TTL, replies into reach.>)."""
    check(case)
