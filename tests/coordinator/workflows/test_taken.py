"""Signals a state took, remembered by stream sequence: one delivered again (a server that
died before it applied the acknowledgement delivers it as new) is not taken twice."""

from __future__ import annotations

import asyncio

import msgspec

from agentreach.agents import ReachClient
from agentreach.broker import Broker, Delivery
from agentreach.coordinator import Coordinator
from agentreach.coordinator.workflows import read_record
from agentreach.coordinator.workflows.run import Note, Run
from agentreach.coordinator.workflows.taken import SIGNALS_REMEMBERED, taken_before
from agentreach.envelopes import new_id
from tests.agents.test_workflow_control import STEPS
from tests.conftest import FAST
from tests.coordinator.workflows.test_run import dispatched, spec, started
from tests.e2e.test_workflows import _until_record, workflows
from tests.support import delivered_again_as_new

LOOP = spec(
    "states: {initial: hold, states: {hold: {intent: check, next: [{event: go, to: hold},"
    " {event: stop, to: done}]}, done: {terminal: true}}}"
)


def test_a_signal_taken_before_moves_nothing_and_is_said_again() -> None:
    """`go` (sequence 7) took the loop's `hold` to its second visit. Delivered again, it
    does not start a third: it calls for what the record's state does (the second visit's
    task, sent again under its own message id) and says `signal_taken` as it did."""
    record, _ = started(LOOP)
    Run(LOOP, record, 2_000).on_signal("go", 2_000, by="alice", seq=7)
    assert [s.visit for s in record.steps.values()] == [2]
    again = Run(LOOP, record, 3_000)
    assert again.on_signal("go", 2_000, by="alice", seq=7)
    assert record.path == ["hold", "hold"] and record.steps["hold"].visit == 2
    assert dispatched(again) == ["hold"]
    said = {"event": "go", "state": "hold", "visit": 1, "signal_seq": 7, "by": "alice"}
    assert Note("signal_taken", detail=said) in again.actions
    assert Run(LOOP, record, 3_000).on_signal("go", 3_000, seq=8)  # another `go`: taken
    assert record.steps["hold"].visit == 3


def test_only_the_last_signals_are_remembered_and_a_sequence_unknown_never() -> None:
    record, _ = started(LOOP)
    for seq in range(1, SIGNALS_REMEMBERED + 6):
        assert Run(LOOP, record, 2_000).on_signal("go", 2_000, seq=seq)
    assert len(record.signals_taken) == SIGNALS_REMEMBERED
    assert taken_before(record, 5) is None and taken_before(record, 6) is not None
    assert Run(LOOP, record, 2_000).on_signal("go", 2_000)  # a direct call: no sequence
    assert taken_before(record, 0) is None
    assert len(record.signals_taken) == SIGNALS_REMEMBERED


async def test_a_signal_delivered_again_as_new_is_not_taken_twice(broker):
    """`go` moved the machine from `first` to `second`, whose state takes `go` too. The
    server delivers that signal again, as new (delivery count 1, the same sequence), as
    one does that died before it applied the acknowledgement: it moved the machine on to
    `done` on one signal. It is known now, and moves nothing; a second `go` does."""
    config = msgspec.structs.replace(FAST, workflows=workflows(steps=STEPS))
    async with Broker(broker.url, names=broker.names, name="coordinator") as own:
        coordinator = Coordinator(own, config)
        handle, deliveries = coordinator.workflows.handle, list[Delivery]()

        async def keeping(msg: Delivery) -> float | None:
            deliveries.append(msg)
            return await handle(msg)

        coordinator.workflows.handle = keeping  # type: ignore[method-assign]
        async with coordinator.running(), ReachClient(broker=broker, name="alice") as alice:
            instance = new_id()
            invoked = asyncio.create_task(alice.invoke("steps", {}, message_id=instance))
            await _until_record(broker, instance, lambda r: r.current == "first")
            assert (await alice.signal_workflow(instance, "go")).state == "first"
            [go] = [d for d in deliveries if ".signal." in d.subject]
            assert go.num_delivered == 1
            assert await handle(delivered_again_as_new(go)) is None
            record = await read_record(own, instance)
            assert record is not None and (record.current, record.status) == ("second", "running")
            assert (await alice.signal_workflow(instance, "go")).state == "second"
            assert await asyncio.wait_for(invoked, 10) == {"went": 2}
            events = await alice.status(instance)
    taken = [
        (e.detail["state"], e.detail["signal_seq"]) for e in events if e.event == "signal_taken"
    ]
    assert taken[0] == ("first", go.stream_seq) and [s for s, _ in taken] == ["first", "second"]
    assert not [e for e in events if e.event == "signal_ignored"]
