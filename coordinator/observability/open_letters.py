"""How many dead letters nobody has dealt with yet, and how long the oldest has waited.

``reach_dlq_messages`` counts every letter ``REACH_DLQ`` keeps (30 days), replayed and
resolved ones included, so it cannot tell a compensation worker that keeps up from one that
stopped: the open count and the oldest open letter's age can. A letter is open until a
``replayed`` or ``resolved`` event names it (as ``reach dlq list --open`` says);
a step letter its workflow handles never is.

Read incrementally: the first read goes through the kept letters and settling events once,
each later one through what was stored since. Settling events are read before letters, so a
letter settled between the two reads is counted open for one sample at most, never forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from agentreach.broker import Broker, StreamNotFound
from agentreach.broker.dead_letters import SETTLING
from agentreach.broker.direct import messages_on
from agentreach.broker.streams import StoredMessage, stream_bounds
from agentreach.envelopes import DecodeError, decode_dead_letter, decode_stored_event

PAGE = 1_000  # messages read at once


@dataclass(frozen=True, slots=True)
class _Open:
    seq: int
    stored_ms: int
    reason: str


class _Cursor:
    """Where the next read of one stream's subject starts."""

    def __init__(self, stream: str, subject: str) -> None:
        self.stream = stream
        self.subject = subject
        self.next_seq = 1
        self.first_kept = 1

    async def new_pages(self, broker: Broker) -> AsyncIterator[list[StoredMessage]]:
        """The messages stored since the last read, a page at a time (a month of letters,
        bodies and all, is never held at once); none when the stream is not there."""
        try:
            self.first_kept, last = await stream_bounds(broker, self.stream)
        except StreamNotFound:
            return
        self.next_seq = max(self.next_seq, self.first_kept, 1)
        while self.next_seq <= last:
            page = await messages_on(
                broker, self.stream, self.subject, from_seq=self.next_seq, limit=PAGE
            )
            if not page:
                self.next_seq = last + 1
                return
            self.next_seq = page[-1].stream_seq + 1
            yield page


class OpenLetters:
    """The open letters' reasons and ages, for the gauges (no letter bodies are kept)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        names = broker.names
        self._letters = _Cursor(names.dlq_stream, names.dlq_wildcard)
        # REACH_SETTLED keeps settling events as long as the letters; REACH_EVENTS (a week)
        # has those of letters settled before that stream was there.
        self._settling = [
            _Cursor(stream, subject(kind))
            for stream, subject in (
                (names.settled_stream, names.settled_of_kind),
                (names.events_stream, names.events_of_kind),
            )
            for kind in SETTLING
        ]
        # Each letter by its message id and when it was written: an id dead-lettered again
        # (in a later life) has a letter of its own, open until an event settles that one.
        self._open: dict[tuple[str, int], _Open] = {}

    async def read(self) -> None:
        settled: set[tuple[str, int | None]] = set()
        for cursor in self._settling:
            async for page in cursor.new_pages(self._broker):
                settled.update(_settled_letters(page))
        async for page in self._letters.new_pages(self._broker):
            for message in page:
                self._take(message)
        first_kept = self._letters.first_kept
        self._open = {
            (message_id, at_ms): shown
            for (message_id, at_ms), shown in self._open.items()
            if not settled & {(message_id, at_ms), (message_id, None)} and shown.seq >= first_kept
        }

    def _take(self, message: StoredMessage) -> None:
        with contextlib.suppress(DecodeError):
            letter = decode_dead_letter(message.data, message.headers, stored=True)
            if not (letter.workflow and letter.workflow.handled):
                self._open[letter.message_id, letter.at_ms] = _Open(
                    message.stream_seq, message.timestamp_ms, letter.reason
                )

    def by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for shown in self._open.values():
            counts[shown.reason] = counts.get(shown.reason, 0) + 1
        return counts

    def oldest_stored_ms(self) -> int | None:
        """When the oldest open letter was stored (None: no letter is open)."""
        return min((shown.stored_ms for shown in self._open.values()), default=None)


def _settled_letters(messages: list[StoredMessage]) -> list[tuple[str, int | None]]:
    """The letters the settling events name: by message id and the letter's ``at_ms`` (None
    from an event recorded before they said which letter: it settles any of the id's)."""
    letters = []
    for message in messages:
        with contextlib.suppress(DecodeError):
            event = decode_stored_event(message.data, message.headers)
            at_ms = event.detail.get("letter_at_ms")
            letters.append((event.message_id, at_ms if isinstance(at_ms, int) else None))
    return letters
