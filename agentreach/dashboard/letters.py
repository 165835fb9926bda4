"""Every open dead letter of ``REACH_DLQ``, for the dashboard's "open only" view: the panel's
last 50 letters leave out an open one older than those, which ``reach dlq list --open``
lists."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import msgspec

from agentreach.agents.letters import letter_state
from agentreach.broker import Broker
from agentreach.broker.direct import messages_on
from agentreach.broker.streams import stream_bounds
from agentreach.envelopes import DeadLetter, DecodeError, Event, decode_dead_letter

# The open letters a snapshot carries, newest first; the rest are counted, not sent (a page
# of thousands of rows helps nobody: `reach dlq list --open` lists them all).
OPEN_SHOWN = 200

Shown = tuple[int, int, DeadLetter]  # (stream sequence, stored_ms, letter)


class OpenLetters:
    """The open letters, kept by reading only the letters stored since the last read: the
    first read goes through the whole stream once, the next ones through what is new."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._next_seq = 1
        # By message id and when the letter was written: an id dead-lettered again (a later
        # life) has a letter of its own, as `reach dlq list --open` lists it.
        self._open: dict[tuple[str, int], Shown] = {}

    def __len__(self) -> int:
        return len(self._open)

    def newest(self, count: int = OPEN_SHOWN) -> list[Shown]:
        """The ``count`` newest open letters, newest first."""
        return sorted(self._open.values(), key=lambda shown: -shown[0])[:count]

    async def read(self, settling: Mapping[str, Sequence[Event]]) -> None:
        """Take the letters stored since the last read; drop those settled since (by
        ``settling``: each letter's replayed and resolved events) or no longer kept."""
        names = self._broker.names
        first, last = await stream_bounds(self._broker, names.dlq_stream)
        start = max(self._next_seq, first, 1)
        stored = []
        if last >= start:
            stored = await messages_on(
                self._broker, names.dlq_stream, names.dlq_wildcard, from_seq=start
            )
        for message in stored:
            with contextlib.suppress(DecodeError):
                letter = decode_dead_letter(message.data, message.headers, stored=True)
                self._open[letter.message_id, letter.at_ms] = (
                    message.stream_seq,
                    message.timestamp_ms,
                    _slim(letter),
                )
        self._next_seq = max(start, last + 1)
        self._open = {
            key: shown
            for key, shown in self._open.items()
            if shown[0] >= first and letter_state(settling.get(key[0]), shown[2]) == "open"
        }


def _slim(letter: DeadLetter) -> DeadLetter:
    """The letter without what the panel does not show (its payload, raw body, trace and
    workflow record): thousands of open letters are kept in memory."""
    task = letter.envelope and msgspec.structs.replace(letter.envelope, payload=None)
    return msgspec.structs.replace(letter, envelope=task, raw=None, trace=[], state=None)
