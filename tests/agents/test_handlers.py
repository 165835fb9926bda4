"""A payload checked against the type its handler declares: where it does not fit."""

from __future__ import annotations

import pytest

from agentreach.agents.handlers import InvalidPayload, typed


@pytest.mark.parametrize(
    ("payload", "declared", "said"),
    [
        ({"b": 1}, dict[str, str], "dict[str, str]`: Expected `str`, got `int` - at `$.b`"),
        ({"a": {"x": 1}}, dict[str, dict[str, str]], "Expected `str`, got `int` - at `$.a.x`"),
        ({"a b": 1}, dict[str, str], 'Expected `str`, got `int` - at `$["a b"]`'),
        ({"a": [1, "x"]}, dict[str, list[int]], "Expected `int`, got `str` - at `$.a[1]`"),
        ([1, "x"], list[int], "`payload: list[int]`: Expected `int`, got `str` - at `$[1]`"),
    ],
)  # fmt: skip
def test_a_value_that_does_not_fit_is_named_by_its_key(payload, declared, said):
    """msgspec names a dict's values `$[...]`; the key is found, and the declared type is
    written out (`dict[str, str]`, not `dict`)."""
    with pytest.raises(InvalidPayload) as refused:
        typed(payload, declared)
    assert said in str(refused.value)
    assert "[...]" not in str(refused.value)
