"""Which attempts this replica routed, and whether that failed.

A decision that failed part way (a dead letter whose event was stored and whose letter a
full ``REACH_DLQ`` refused) comes back with its message, and must end as it was decided,
not be decided again: a `rejected` retry was routed as a breaker's trial call when it came
back, and completed; it ended twice (an on-call re-drill). Whether a decision was stored is
read from the message's events, but only for an attempt this replica did not route before,
or failed to: a task held back for an agent comes back every second, and is not read again.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator

from agentreach.envelopes import Task

REMEMBERED = 100_000  # the latest attempts kept

_Attempt = tuple[str | None, str, int, int]


class RoutedHere:
    """The attempts this replica routed (the latest :data:`REMEMBERED`), and whether that
    failed: what it stored then may stand."""

    def __init__(self) -> None:
        self._failed: OrderedDict[_Attempt, bool] = OrderedDict()

    def unsure(self, task: Task) -> bool:
        """Whether a decision about ``task``'s attempt may be stored: it was not routed here
        before, or that failed."""
        return self._failed.get(_attempt(task), True)

    @contextlib.contextmanager
    def noting(self, task: Task) -> Iterator[None]:
        """Around a routing of ``task``: failed until the block ends without an error."""
        key = _attempt(task)
        self._failed[key] = True
        self._failed.move_to_end(key)
        while len(self._failed) > REMEMBERED:
            self._failed.popitem(last=False)
        yield
        self._failed[key] = False


def _attempt(task: Task) -> _Attempt:
    return task.caller, task.message_id, task.received_ms, task.attempt
