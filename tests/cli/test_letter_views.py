"""How `reach dlq list` shows letters: one row each, however long an error is."""

from __future__ import annotations

from agentreach.cli.letter_views import ERROR_SHOWN, print_letters
from agentreach.envelopes import DeadLetter, ErrorInfo


def test_a_long_error_is_cut_in_its_row(capsys) -> None:
    """A deeply nested payload's decode error filled the screen (an outside trial)."""
    long = "Expected `object`, got `array` - at `$.a" + "[0]" * 2_000 + "`"
    letter = DeadLetter(
        v=1,
        reason="invalid_envelope",
        message_id="m-1",
        trace_id="m-1",
        topic="t",
        error=ErrorInfo(type="invalid_envelope", message=long),
    )
    print_letters([letter], {("m-1", letter.at_ms): "open"}, only_open=False)
    header, row = capsys.readouterr().out.splitlines()
    error = row[header.index("ERROR") :]
    assert len(error) == ERROR_SHOWN and error.endswith("…") and error.startswith("Expected")
