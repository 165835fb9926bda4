"""An audit record's durations: intake, queued, executing and retry_wait split the time from
receipt to the end, so they add up to the total whatever way the message ended."""

from __future__ import annotations

import msgspec
import pytest

from agentreach.broker.lifecycle import event_for
from agentreach.broker.streams import StoredMessage
from agentreach.coordinator.observability.audit import audit_record
from agentreach.envelopes import Task
from agentreach.envelopes.audit import Durations

RECEIVED_MS = 1_000_000
TASK = Task(v=1, message_id="m-1", trace_id="t-1", topic="slow", received_ms=RECEIVED_MS)


def record_of(*timeline: tuple[float, str, int], ending: int = -1) -> Durations:
    """The durations of the record of ``(ms after receipt, event, attempt)`` in stream
    order, ``timeline[ending]`` the ending, as the audit writer reads them."""
    stored = []
    for seq, (after_ms, kind, attempt) in enumerate(timeline, start=1):
        task = msgspec.structs.replace(TASK, attempt=attempt)
        event = event_for(task, kind, agent_id=None if kind == "dead_lettered" else "worker")
        at_ns = int((RECEIVED_MS + after_ms) * 1_000_000)
        stored.append((StoredMessage(seq, "reach.event", b"", {}, at_ns), event))
    message, event = stored[ending]
    return audit_record(event, message.timestamp_ns / 1e6, stored).durations


def parts(d: Durations) -> float:
    return d.intake + d.queued + d.executing + d.retry_wait


def test_a_task_that_expired_in_an_agents_queue_was_queued_until_its_dead_letter():
    """10 s in the queue, then the agent's `expired` report and the dead letter: queued holds
    the 10 s (it was 0, and nothing added up to the total)."""
    d = record_of((4.5, "routed", 1), (10_140.2, "expired", 1), (10_159.0, "dead_lettered", 1))
    assert d == Durations(total=10_159.0, intake=4.5, queued=10_154.5)


def test_a_retry_wait_that_ends_in_a_dead_letter_counts_to_the_end():
    """Two retries scheduled, the second refused after its wait (the agent was isolated
    meanwhile): both waits count, not only the one that ended in a routing."""
    d = record_of(
        (3.0, "routed", 1),
        (5.0, "accepted", 1),
        (9.0, "failed", 1),
        (12.0, "retry_scheduled", 1),
        (1000.0, "routed", 2),
        (1002.0, "accepted", 2),
        (1007.0, "failed", 2),
        (1010.0, "retry_scheduled", 2),
        (2662.0, "dead_lettered", 2),
    )
    assert d.retry_wait == pytest.approx(991.0 + 1655.0)
    assert (d.intake, d.queued, d.executing) == (3.0, 4.0, 9.0)
    assert parts(d) == pytest.approx(d.total) == 2662.0


def test_retries_exhausted_and_completed_after_retries_add_up():
    """Three failed attempts to retries_exhausted, and two failures then a completion."""
    exhausted = record_of(
        (10.5, "routed", 1),
        (13.4, "accepted", 1),
        (117.6, "failed", 1),
        (188.6, "routed", 2),
        (190.2, "accepted", 2),
        (294.5, "failed", 2),
        (419.3, "routed", 3),
        (421.7, "accepted", 3),
        (530.1, "failed", 3),
        (557.0, "dead_lettered", 3),
    )
    completed = record_of(
        (12.4, "routed", 1),
        (15.1, "accepted", 1),
        (119.6, "failed", 1),
        (190.6, "routed", 2),
        (192.8, "accepted", 2),
        (296.6, "failed", 2),
        (424.2, "routed", 3),
        (427.2, "accepted", 3),
        (532.0, "completed", 3),
    )
    for d in (exhausted, completed):
        assert parts(d) == pytest.approx(d.total, abs=0.01)
    assert exhausted.retry_wait == pytest.approx(71.0 + 124.8 + 26.9)
    assert completed.executing == pytest.approx(104.5 + 103.8 + 104.8)


def test_a_message_never_routed_spent_its_time_in_intake():
    """A dead letter straight from routing (no_route): all of it is intake."""
    d = record_of((7.25, "dead_lettered", 1))
    assert d == Durations(total=7.25, intake=7.25)


def test_a_workflows_own_message_executes_from_its_start():
    """A workflow is not routed: from `workflow_started` to its end it executes its steps."""
    d = record_of((2.0, "workflow_started", 1), (900.0, "workflow_completed", 1))
    assert d == Durations(total=900.0, intake=2.0, executing=898.0)


def test_an_event_stored_after_the_ending_adds_nothing():
    """The ending comes first in the stream (a cluster stored the routing later): the
    phases still add up to the total, none negative."""
    d = record_of((1.5, "completed", 1), (3.0, "routed", 1), ending=0)
    assert d == Durations(total=1.5, intake=1.5)


def test_a_run_inside_one_millisecond_still_executed():
    """Accepted and completed in the same millisecond of the broker's clock (a no-op
    handler): the run counts its fraction of a millisecond, not 0 (the end was cut to
    whole milliseconds, and the run clamped to nothing)."""
    d = record_of((2.1, "routed", 1), (3.2, "accepted", 1), (3.7, "completed", 1))
    assert d.executing == pytest.approx(0.5) and d.total == pytest.approx(3.7)
