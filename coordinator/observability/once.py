"""Which messages the fold saw end already: a task is counted finished once."""

from __future__ import annotations

from collections import OrderedDict

REMEMBERED = 65_536  # ends remembered; the oldest is forgotten first


class Ends:
    """The last ``limit`` messages seen ending, by trace and message id (an agent's event
    need not name the caller). A second ending
    (a result sent again after the stream's two-minute dedup window, a completion after a
    dead letter) is not a second finished task. Per replica and since its start: an ending
    told again to another replica, or after a restart, is counted again."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._limit = limit

    def first(self, trace_id: str, message_id: str) -> bool:
        """Whether this is the first ending seen of the message (and remember it)."""
        key = (trace_id, message_id)
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return True
