"""One task the kit sent and what came back of it: replies and events, with their headers,
and the words a failure uses for what the agent said of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentreach.broker.names import COORDINATOR
from agentreach.envelopes import Event, Task

AGENT_REPLIES = ("ack", "progress", "result", "error")  # not the coordinator's routed notice


@dataclass
class Seen:
    """A message that came back, with its headers and the kit's time of receipt."""

    body: Any
    headers: dict[str, str]
    at: float
    subject: str = ""


@dataclass
class Exchange:
    """One task the kit sent: what came back on its reply subject and as its events."""

    task: Task
    replies: list[Seen] = field(default_factory=list)
    events: list[Seen] = field(default_factory=list)
    sent_at: float = 0.0
    grant: str | None = None  # the Reach-Grant the kit put on its dispatches of the task
    seqs: list[int] = field(default_factory=list)  # where its dispatches were stored

    def replies_of(self, kind: str) -> list[Any]:
        return [r.body for r in self.replies if r.body.__struct_config__.tag == kind]

    def agent_replies(self) -> list[Seen]:
        """What came back on the reply subject, without the coordinator's routed notices."""
        return [r for r in self.replies if r.body.__struct_config__.tag in AGENT_REPLIES]

    def events_of(self, name: str) -> list[Event]:
        return [e.body for e in self.events if e.body.event == name]

    def runs(self) -> int:
        """How many times the handler started (the ``sleep`` op reports ``started`` once
        per run)."""
        return sum(p.note == "started" for p in self.replies_of("progress"))

    def said(self) -> str:
        """What the agent said of the task, for a failure that waited for something else
        (§18: FAIL with what it saw instead): its events, a ``completed``'s result and a
        ``failed``'s error, and any result reply."""
        told = [
            _told(e) for e in self._agents(None, self.events) if e.event in (*OUTCOMES, "accepted")
        ]
        if told:
            said = f"the agent published {', '.join(told)}"
        else:
            said = "the agent published no event of it"
        results = [_short(r.result_ref or r.result) for r in self._agents("result", self.replies)]
        if results:
            return f"{said}, and sent the result {', '.join(results)}"
        return said

    @staticmethod
    def _agents(kind: str | None, seen: list[Seen]) -> list[Any]:
        """What an agent sent (by the sender token), not the coordinator: of ``kind``, when
        given (a reply's)."""
        return [
            m.body
            for m in seen
            if m.subject.rsplit(".", 1)[-1] != COORDINATOR
            and (kind is None or m.body.__struct_config__.tag == kind)
        ]

    def ended_otherwise(self, wanted: str) -> str | None:
        """What the agent said of the task when it ended it otherwise than by the ``wanted``
        event (another outcome, or a result when ``wanted`` is not ``completed``), else None."""
        others = [
            e for e in self._agents(None, self.events) if e.event in OUTCOMES and e.event != wanted
        ]
        if others or (wanted != "completed" and self._agents("result", self.replies)):
            return self.said()
        return None


OUTCOMES = ("completed", "failed", "expired")  # the agent's events that end an attempt
SHOWN_CHARS = 200  # of a result in a failure's words (clause 13's is 300,000 characters)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}… ({len(text)} characters)"


def _told(event: Event) -> str:
    """One event as a failure says it: a ``completed`` with its result, a ``failed`` with
    its error."""
    name = f"{event.event} (attempt {event.attempt})"
    if event.event == "completed":
        result = event.detail.get("result_ref") or event.detail.get("result")
        return f"{name} with result {_short(result)}"
    if event.event == "failed" and isinstance(error := event.detail.get("error"), dict):
        return f"{name} with error {error.get('type')!r}: {_short(error.get('message'))}"
    return name
