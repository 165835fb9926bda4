"""What ``reach dlq`` prints of dead letters: the list (a table, or JSON lines), one letter,
the counts by reason and topic."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections import Counter

import msgspec

from agentreach.agents.letters import letter_state
from agentreach.cli.terminal import one_line
from agentreach.envelopes import DeadLetter, Event

ERROR_SHOWN = 160  # characters of a letter's error in a row of `reach dlq list`


def letter_key(letter: DeadLetter) -> tuple[str, int]:
    return letter.message_id, letter.at_ms


def listed(letter: DeadLetter, state: str) -> dict[str, object]:
    """What ``reach dlq list`` says of a letter, for scripts (``--json``)."""
    return {
        "message_id": letter.message_id,
        "trace_id": letter.trace_id,
        "reason": letter.reason,
        "topic": letter.topic,
        "state": state,
        "at_ms": letter.at_ms,
        "attempts": letter.attempts,
        "replays": letter.replays,
        "error": msgspec.to_builtins(letter.error) if letter.error else None,
    }


def print_none_matching(
    reason: str | None, topic: str | None, there: dict[str, Counter[str]]
) -> None:
    """No letter matches the filters: which reasons and topics there are (a typo shows)."""
    wanted = [f"{key} {value!r}" for key, value in (("reason", reason), ("topic", topic)) if value]
    print(f"no dead letters with {' and '.join(wanted)}")
    for key, counter in there.items():
        if counter:
            listed = ", ".join(f"{name} {n}" for name, n in sorted(counter.items()))
            print(f"reach: the {key}s there are: {listed}", file=sys.stderr)


def print_letters(
    letters: list[DeadLetter], states: dict[tuple[str, int], str], *, only_open: bool
) -> None:
    """A table whose columns are as wide as what they hold (workflow step ids are long)."""
    if not letters:
        print("no open dead letters" if only_open else "no dead letters")
        return
    rows = [
        (
            letter.message_id,
            dt.datetime.fromtimestamp(letter.at_ms / 1000).strftime("%Y-%m-%dT%H:%M:%S"),
            letter.reason,
            letter.topic,
            states[letter_key(letter)],
            _cut(one_line(letter.error.message)) if letter.error else "",
        )
        for letter in letters
    ]
    header = ("MESSAGE_ID", "AT", "REASON", "TOPIC", "STATE", "ERROR")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[5]]).rstrip())


def _cut(text: str, width: int = ERROR_SHOWN) -> str:
    """An error in a row: a payload's deep error once filled the screen (`dlq show` has it
    whole)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def print_letter(letter: DeadLetter, settling: list[Event]) -> None:
    """The letter as JSON, with its state as ``reach dlq list`` says it (``letter_state``)
    and the events that settled it (``settled_by``): who replayed or resolved it, when, and
    as which message or with which note. Its own ``state`` is a failed workflow's record."""
    shown = msgspec.to_builtins(letter)
    if shown.get("state") is None:  # no workflow's record: a `"state": null` read as the letter's
        shown.pop("state", None)
    shown["letter_state"] = letter_state(settling, letter)
    shown["settled_by"] = [
        {"event": event.event, "at_ms": event.at_ms, **event.detail} for event in settling
    ]
    print(json.dumps(shown, indent=2, ensure_ascii=False))


def print_stats(letters: list[DeadLetter], settled: dict[str, list[Event]]) -> None:
    """Letters kept and those still open, by reason and topic (the open ones are the work
    left to do)."""
    kept: Counter[tuple[str, str]] = Counter()
    still_open: Counter[tuple[str, str]] = Counter()
    for letter in letters:
        kept[letter.reason, letter.topic] += 1
        if letter_state(settled.get(letter.message_id), letter) == "open":
            still_open[letter.reason, letter.topic] += 1
    print(f"{'REASON':<20} {'TOPIC':<24} {'LETTERS':>7} {'OPEN':>6}")
    for (reason, topic), count in sorted(kept.items()):
        print(f"{reason:<20} {topic:<24} {count:>7} {still_open[reason, topic]:>6}")
    print(f"{'total':<45} {len(letters):>7} {still_open.total():>6}")
