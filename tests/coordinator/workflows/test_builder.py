"""The Python builder's errors, as good as the YAML's: a walkthrough met a bare "Object
contains unknown field `timeout`" (which step?), and an ``AttributeError`` from inside the
definition for a step given where a state belongs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from agentreach.coordinator import workflow as wf

MISTAKES: list[tuple[Callable[[], Any], type[Exception], str]] = [
    (
        lambda: wf.step("charge", "pay", timeout=3),
        msgspec.ValidationError,
        "step 'charge': Object contains unknown field `timeout` (did you mean 'timeout_s'?)",
    ),
    (
        lambda: wf.step("charge", "pay", timeout_s="soon"),
        msgspec.ValidationError,
        "step 'charge': Expected `float | null`, got `str` - at `$.timeout_s`",
    ),
    (
        lambda: wf.step("charge", "pay", on_error="refund"),
        msgspec.ValidationError,
        "`on_error` belongs to a state machine's state, not here",
    ),
    (
        lambda: wf.state("pay", nxt=[wf.go("paid")]),
        msgspec.ValidationError,
        "state of intent 'pay': Object contains unknown field `nxt` (did you mean 'next'?)",
    ),
    (
        lambda: wf.machine("pending", {"pending": wf.step("charge", "pay")}),
        TypeError,
        "machine: state 'pending' is wf.step(...), a step of a chain, fan-out or graph;"
        " a state is wf.state(intent, ...)",
    ),
    (
        lambda: wf.chain(wf.step("a", "x"), "b"),
        TypeError,
        "chain: step 2 is 'b'; a step is wf.step(name, intent, ...)",
    ),
    (
        lambda: wf.fanout([wf.step("a", "x"), wf.state("y", terminal=True)]),
        TypeError,
        "fanout: step 2 is wf.state(...), a state machine's",
    ),
    (
        lambda: wf.go("paid", when=("paid", "==")),
        ValueError,
        "go('paid'): when=('paid', '==') is (field, operator, value)",
    ),
    (
        lambda: wf.go("paid", when=("paid", "~", True)),
        msgspec.ValidationError,
        "go('paid')'s when: Invalid enum value '~' - at `$.op`",
    ),
]


@pytest.mark.parametrize(("build", "kind", "said"), MISTAKES)
def test_a_mistake_in_a_python_definition_names_its_part(
    build: Callable[[], Any], kind: type[Exception], said: str
) -> None:
    with pytest.raises(kind) as raised:
        build()
    assert said in str(raised.value)


def test_validation_errors_stay_value_errors_as_documented() -> None:
    with pytest.raises(ValueError, match="step 'a'"):
        wf.step("a", "x", retries="many")


def test_a_good_definition_is_built_as_the_yaml_gives_it() -> None:
    built = wf.machine(
        "pending",
        {
            "pending": wf.state("charge", next=[wf.go("paid", when=("paid", "==", True))]),
            "paid": wf.state("ship", terminal=True),
        },
    )
    yaml = """
states:
  initial: pending
  states:
    pending: {intent: charge, next: [{to: paid, when: {field: paid, op: "==", value: true}}]}
    paid: {intent: ship, terminal: true}
"""
    assert built == msgspec.yaml.decode(yaml.encode(), type=type(built))
