"""The one condition matcher that routing rules and workflow transitions share (no server)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentreach.coordinator.conditions import MISSING, Comparison, lookup
from agentreach.coordinator.routing.rules import Condition
from agentreach.coordinator.workflows.spec import When
from agentreach.envelopes import Task


@pytest.mark.parametrize(
    ("op", "value", "found", "holds"),
    [
        ("==", 3, 3, True),
        ("!=", 3, 3, False),
        ("<", 5, 3, True),
        (">=", 3, 3, True),
        ("in", ["a", "b"], "b", True),
        ("in", ["a", "b"], "c", False),
        ("exists", True, 0, True),
        ("exists", False, MISSING, True),
        ("exists", None, MISSING, False),
        ("==", 3, MISSING, False),
        ("<", 5, "three", False),  # incomparable: simply no match
    ],
)
def test_comparisons(op, value, found, holds) -> None:
    """Each operator on present, absent and incomparable values."""
    assert Comparison(op=op, value=value).holds_for(found) is holds


def test_bad_values_for_an_operator_are_refused() -> None:
    """``in`` needs a list, ``exists`` a boolean."""
    with pytest.raises(ValueError, match="op 'in' needs a list"):
        Comparison(op="in", value="a")
    with pytest.raises(ValueError, match="op 'exists' takes true or false"):
        Comparison(op="exists", value="yes")


def test_rules_and_workflows_judge_alike() -> None:
    """A rule condition on the payload and a workflow transition on a result agree."""
    payload = {"order": {"amount": 1200, "items": [{"sku": "x"}]}}
    task = Task(v=1, message_id="m", trace_id="t", topic="pay", payload=payload)
    for path, op, value in [
        ("order.amount", ">=", 1000),
        ("order.items.0.sku", "==", "x"),
        ("order.missing", "exists", False),
    ]:
        rule = Condition(field=f"payload.{path}", op=op, value=value)
        transition = When(field=path, op=op, value=value)
        assert rule.holds(task) and transition.holds(payload)


@given(
    st.recursive(
        st.integers() | st.text(max_size=3),
        lambda c: st.dictionaries(st.text(max_size=3), c, max_size=3),
    )
)
def test_lookup_of_the_empty_path_is_the_value_itself(value) -> None:
    """``lookup(v, "")`` is ``v``; a path through a non-container is MISSING."""
    assert lookup(value, "") is value
    if not isinstance(value, dict):
        assert lookup(value, "a") is MISSING
