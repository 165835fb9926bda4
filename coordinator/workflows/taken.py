"""Each signal judged once, and none after a newer one.

A server that dies before it applied a signal's acknowledgement delivers the signal again,
as new (its delivery count 1), once the consumer's ack wait has passed, or at once beside a
delivery still being handled: by then newer signals of the instance may have been handled
(a drill: 40 in 5 s). So the record keeps the sequence of the latest signal handled (taken
or ignored), and every signal a state took until the server said it applied the
acknowledgement (on this replica: :class:`Confirmed`; at most SIGNALS_REMEMBERED), whose
``signal_taken`` may not be published yet. A signal at or below that sequence is not judged
again: one kept answers again as it did; one taken and forgotten has its answer in the
instance's events; any other (ignored before, or held up by a failure) is ignored, saying
``superseded_by``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from agentreach.envelopes import WorkflowRecord
from agentreach.envelopes.coordination import SignalTaken

SIGNALS_REMEMBERED = 64  # per instance, taken and not known to be applied
CONFIRMED_KEPT = 20_000  # signals known applied, per replica (a few MB); one evicted stays kept


def taken_before(record: WorkflowRecord, seq: int) -> SignalTaken | None:
    """How a state took the signal stored at ``seq``, if one did (0: a sequence unknown)."""
    if seq:
        for taken in reversed(record.signals_taken):
            if taken.seq == seq:
                return taken
    return None


def handled_before(record: WorkflowRecord, seq: int) -> bool:
    """Whether the signal at ``seq``, or one stored after it, was judged already (and the
    record does not keep it: see :func:`taken_before`)."""
    return 0 < seq <= record.last_signal_seq and taken_before(record, seq) is None


def judged(record: WorkflowRecord, seq: int) -> bool:
    """Note that the signal at ``seq`` was judged (not taken); False: nothing to write (an
    ended instance takes none: its record is not written for it)."""
    if record.finished or seq <= record.last_signal_seq:
        return False
    record.last_signal_seq = seq
    return True


def remember(record: WorkflowRecord, taken: SignalTaken, applied: Callable[[int], bool]) -> None:
    """Keep ``taken``, and forget the signals whose acknowledgement was ``applied``."""
    if not taken.seq:
        return
    kept = [t for t in record.signals_taken if not applied(t.seq)]
    record.signals_taken = [*kept[1 - SIGNALS_REMEMBERED :], taken]
    record.last_signal_seq = max(record.last_signal_seq, taken.seq)


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


class Confirmed:
    """The signals whose acknowledgement the server said it applied: they can come back no
    more, and a record need not keep them."""

    def __init__(self, limit: int = CONFIRMED_KEPT) -> None:
        self._limit = limit
        self._seqs: OrderedDict[tuple[str, int], None] = OrderedDict()

    def add(self, instance_id: str, seq: int) -> None:
        self._seqs[instance_id, seq] = None
        while len(self._seqs) > self._limit:
            self._seqs.popitem(last=False)

    def of(self, instance_id: str) -> Callable[[int], bool]:
        return lambda seq: (instance_id, seq) in self._seqs
