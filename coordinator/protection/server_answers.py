"""The NATS server's answers that someone aimed at our subjects (see
:mod:`agentreach.envelopes.server_answers`): one dead letter a minute says so, with how many
came since; the rest are dropped, counted. A letter for each would let anyone fill REACH_DLQ
at the server's speed, charged to no quota."""

from __future__ import annotations

import structlog

from agentreach.broker.link import RepeatedLines
from agentreach.envelopes import ServerAnswer

log = structlog.get_logger("coordinator.server_answers")

LETTER_EVERY_S = 60.0


class ServerAnswers:
    """Which server answers get a dead letter: the first of each ``where`` a minute."""

    def __init__(self, every_s: float = LETTER_EVERY_S) -> None:
        self._letters = RepeatedLines(every_s)

    def to_letter(self, answer: ServerAnswer, where: str) -> ServerAnswer | None:
        """``answer`` as its letter says it, or None: dropped, counted in the next letter."""
        since = self._letters.due(where)
        if since is None:
            log.debug("a server's answer aimed at our subject: dropped", where=where)
            return None
        if not since:
            return answer
        return ServerAnswer(f"{answer} ({since} more since the last letter of one, dropped)")
