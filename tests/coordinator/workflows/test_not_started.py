"""A signal or cancel of an instance not started yet: looked at again, less and less often,
then dropped, and said in the trace of the id it named."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from structlog.testing import capture_logs

from agentreach.broker import read_stream
from agentreach.broker.lifecycle import emit, event_for
from agentreach.coordinator.workflows.signals import (
    NO_INSTANCE_TOLD_PER_MINUTE,
    NOT_STARTED_LOOK_S,
    NOT_STARTED_LOOKS,
    look_again,
)
from agentreach.envelopes import Event, Task, decode_as


def _delivered(times: int, seq: int = 1) -> SimpleNamespace:
    return SimpleNamespace(num_delivered=times, stream_seq=seq)


async def test_a_signal_of_no_instance_is_looked_at_again_less_and_less_often_then_dropped(
    broker,
):
    """Every 0.5 s for 15 s, a caller's 5,000 signals to no instance were 150,000 deliveries
    before every workflow's replies, timers and signals (a security re-test): the first look
    again comes as soon, then each twice as far apart, about 15 s in all."""
    waits = []
    for delivered in range(1, 100):
        wait = await look_again(broker, _delivered(delivered), "signal", "nope-1.pay")  # type: ignore[arg-type]
        if wait is None:
            break
        waits.append(wait)
    assert waits[0] == NOT_STARTED_LOOK_S
    assert all(b == 2 * a for a, b in itertools.pairwise(waits))
    assert 10 <= sum(waits) <= 20 and len(waits) <= 6


async def test_dropping_many_is_said_a_few_times_a_minute(broker):
    """1,500 signals to instances never started made 1,500 warnings (a drill)."""
    last = _delivered(NOT_STARTED_LOOKS)
    with capture_logs() as logs:
        for n in range(50):
            assert await look_again(broker, last, "signal", f"never-{n}.pay.flooder") is None  # type: ignore[arg-type]
    said = [line for line in logs if line["event"] == "signal of no workflow instance; dropped"]
    assert len(said) <= 5  # some may have been said by an earlier test of this process
    stored = await read_stream(broker, broker.names.events_stream, f"{broker.names.prefix}.>")
    told = [decode_as(m.data, Event) for m in stored]
    assert 1 <= len([e for e in told if e.caller == "flooder"]) <= NO_INSTANCE_TOLD_PER_MINUTE


async def test_a_dropped_signal_or_cancel_is_said_in_the_trace_of_the_id_it_named(broker):
    """A mistyped id on the raw subject vanished with a log line alone, and `reach trace ID`
    said no event was recorded (a trial). Its sender reads why in that trace."""
    last = _delivered(NOT_STARTED_LOOKS, seq=41)
    await look_again(broker, last, "signal", "typo-1.pay.alice")  # type: ignore[arg-type]
    await look_again(broker, last, "cancel", "typo-2")  # type: ignore[arg-type]
    stored = await read_stream(broker, broker.names.events_stream, f"{broker.names.prefix}.>")
    [signal, cancel] = [decode_as(m.data, Event) for m in stored]
    assert (signal.event, signal.trace_id, signal.caller) == ("signal_ignored", "typo-1", "alice")
    assert signal.detail["signal"] == "pay" and signal.detail["signal_seq"] == 41
    assert signal.detail["error"]["type"] == "no_instance"
    assert "no workflow instance 'typo-1'" in signal.detail["error"]["message"]
    assert (cancel.event, cancel.trace_id, cancel.caller) == ("cancel_refused", "typo-2", None)
    assert "the cancel was dropped" in cancel.detail["error"]["message"]


async def test_nothing_is_said_in_the_trace_of_an_id_that_has_events(broker):
    """Mallory signalled alice's task id: "no workflow instance 'alice-order-42' … a
    mistyped id?" stood in alice's trace, as mallory's (a review). Only an id nothing is
    recorded of gets the event."""
    alice = Task(v=1, message_id="alice-order-42", trace_id="alice-order-42", topic="orders",
                 caller="alice")  # fmt: skip
    await emit(broker, event_for(alice, "routed", agent_id="a-1"))
    await look_again(broker, _delivered(NOT_STARTED_LOOKS), "signal", "alice-order-42.pay.mallory")  # type: ignore[arg-type]
    stored = await read_stream(broker, broker.names.events_stream, f"{broker.names.prefix}.>")
    assert [decode_as(m.data, Event).event for m in stored] == ["routed"]
