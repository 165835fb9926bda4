"""What the CLI prints is shown, never obeyed by the terminal.

Agents and callers write much of what an operator reads: card tags, progress notes, errors,
results, payloads. A control character among them is an instruction to the terminal: an
escape sequence sets the window title or writes the clipboard (OSC 52), a carriage return
and an erase draw a forged row over the real one, a C1 CSI does what ESC [ does, a bidi
override reorders what is read. Each such character is printed as its JSON escape
(``\\u001b``): readable in a table, and the same character to whoever parses a JSON view.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

# C0 but the tab and the newline, DEL, C1, and the bidi controls.
_OBEYED = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[{_OBEYED}]")
_CONTROLS_OR_BREAKS = re.compile(f"[{_OBEYED}\t\n]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def shown(text: str) -> str:
    """``text`` with every character a terminal would act on written as its escape."""
    return _CONTROLS.sub(_escaped, text)


def one_line(text: str) -> str:
    """``text`` for a cell of a table: its line breaks and tabs escaped too, so that it can
    neither start a row of its own nor push the columns."""
    return _CONTROLS_OR_BREAKS.sub(_escaped, text)


class ShownStream:
    """A text stream whose writes are :func:`shown` before they reach ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(shown(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, …
        return getattr(self.stream, name)


@contextlib.contextmanager
def shown_output() -> Iterator[None]:
    """stdout and stderr :func:`shown` while the block runs (a command's whole output)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ShownStream(out), ShownStream(err)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def control(sequence: str) -> None:
    """Write a control sequence of the CLI's own (a redraw's clear) to the terminal as it is."""
    out = sys.stdout
    raw = out.stream if isinstance(out, ShownStream) else out
    raw.write(sequence)
