"""The signals an instance's states took, remembered in its record by stream sequence.

A server that dies before it applied a signal's acknowledgement delivers the signal again,
as new (its delivery count 1): a state waiting for the same event, a loop's, would take it
a second time. A signal comes back among its consumer's unacknowledged messages, soon
after a restart; the last SIGNALS_REMEMBERED taken cover those of one instance.
"""

from __future__ import annotations

from agentreach.envelopes import WorkflowRecord
from agentreach.envelopes.coordination import SignalTaken

SIGNALS_REMEMBERED = 32


def taken_before(record: WorkflowRecord, seq: int) -> SignalTaken | None:
    """How a state took the signal stored at ``seq``, if one did (0: a sequence unknown)."""
    if seq:
        for taken in reversed(record.signals_taken):
            if taken.seq == seq:
                return taken
    return None


def remember(record: WorkflowRecord, taken: SignalTaken) -> None:
    if taken.seq:
        record.signals_taken = [*record.signals_taken[1 - SIGNALS_REMEMBERED :], taken]


def said(taken: SignalTaken) -> dict[str, object]:
    """The detail of its ``signal_taken`` event: about the instance, which its starter may
    read (the step's task is not its)."""
    detail: dict[str, object] = {
        "event": taken.event,
        "state": taken.state,
        "visit": taken.visit,
        "signal_seq": taken.seq,
    }
    return detail | ({"by": taken.by} if taken.by else {})
