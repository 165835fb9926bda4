"""The NATS server's answers that someone aimed at our subjects (see
:mod:`agentreach.envelopes.server_answers`), and a sender's unreadable messages on its own
subjects: one dead letter a minute says so, with how many came since; the rest are dropped,
counted. A letter for each would let anyone fill REACH_DLQ at the server's speed (or an
agent at its own), charged to no quota."""

from __future__ import annotations

from collections import Counter

import structlog

from agentreach.broker import Delivery
from agentreach.envelopes import DecodeError, ServerAnswer, refuse_server_answers
from agentreach.logs import RepeatedLines

log = structlog.get_logger("coordinator.server_answers")

LETTER_EVERY_S = 60.0
DROPPED_SAID_PER_INTERVAL = 5
# Dropped since this process started, by where (``reach_messages_dropped_total``): the count
# a letter carries went out only with the next letter, lost when none came (a trial).
DROPPED: Counter[str] = Counter()


class ServerAnswers:
    """Which server answers get a dead letter: the first of each ``where`` a minute."""

    def __init__(self, every_s: float = LETTER_EVERY_S) -> None:
        self._letters = RepeatedLines(every_s)
        # A few of those dropped are said as warnings (an operator's `nats pub` with no
        # header, on a secured server, is one): the rest at debug, as they may be a flood.
        self._dropped = RepeatedLines(every_s, burst=DROPPED_SAID_PER_INTERVAL)

    def judged(
        self, exc: DecodeError, msg: Delivery, where: str, *, headed: bool = False, by: str = ""
    ) -> DecodeError | None:
        """Why ``msg`` could not be read, as its letter says it: ``exc``, or what the server
        wrote it as; None when it is a server's answer to drop. ``headed``: where every
        party's message carries headers (one without is a server's answer). ``by``: the
        sender ``msg``'s subject names, whose unreadable messages get a letter a minute too
        (its subject is its own to fill, at its own pace)."""
        try:
            refuse_server_answers(msg.data, msg.headers, msg.subject, headed=headed)
        except ServerAnswer as answer:
            return self.to_letter(answer, where)
        if isinstance(exc, ServerAnswer):  # told by its reader (no headers where all have some)
            return self.to_letter(exc, where)
        return self.to_letter(exc, f"{where} from {by}") if by else exc

    def to_letter(self, answer: DecodeError, where: str) -> DecodeError | None:
        """``answer`` as its letter says it, or None: dropped, counted in the next letter."""
        since = self._letters.due(where)
        if since is None:
            DROPPED[where.split(" from ", 1)[0]] += 1  # not by sender: anyone names one
            said = log.warning if self._dropped.due(where) is not None else log.debug
            what = "a server's answer aimed at our subject"
            if not isinstance(answer, ServerAnswer):
                what = "an unreadable message"
            said(f"{what}: dropped (the letter of one a minute says how many)",
                 where=where, why=str(answer))  # fmt: skip
            return None
        if not since:
            return answer
        more = f"{answer} ({since} more since the last letter of one, dropped)"
        return type(answer)(more, path=answer.path)
