"""Signals a state took, remembered by stream sequence: one delivered again (a server that
died before it applied the acknowledgement delivers it as new) is not taken twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach.agents import ReachClient
from agentreach.broker import Broker, BrokerError, Delivery, direct
from agentreach.coordinator import Coordinator, consumption
from agentreach.coordinator.workflows import controls, read_record
from agentreach.coordinator.workflows.run import Note, Run
from agentreach.coordinator.workflows.taken import (
    SIGNALS_REMEMBERED,
    handled_before,
    judged,
    taken_before,
)
from agentreach.envelopes import headers as h
from agentreach.envelopes import new_id
from tests.agents.test_workflow_control import STEPS
from tests.conftest import FAST
from tests.coordinator.workflows.test_run import dispatched, spec, started
from tests.e2e.test_workflows import _until_record, workflows
from tests.support import delivered_again_as_new, eventually

FLIPPER = """
states:
  initial: a
  states:
    a: {next: [{event: flip, to: b}, {event: stop, to: done}]}
    b: {next: [{event: flip, to: a}, {event: flop, to: a}]}
    done: {terminal: true}
"""
Handle = Callable[[Delivery], Awaitable[float | None]]

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


def test_a_signal_is_kept_until_its_acknowledgement_is_known_applied() -> None:
    """Taken signals are kept until the server said it applied their acknowledgement (they
    can come back no more), however many newer ones are taken meanwhile: the one whose
    acknowledgement a crash lost came back after 40 newer ones (a drill), and the last 32
    kept had forgotten it. At most SIGNALS_REMEMBERED are kept; a sequence unknown, never."""
    record, _ = started(LOOP)
    lost = 7  # its acknowledgement died with the server
    Run(LOOP, record, 2_000).on_signal("go", 2_000, seq=lost)
    applied = lambda seq: seq != lost  # noqa: E731
    for seq in range(100, 140):
        assert Run(LOOP, record, 2_000).on_signal("go", 2_000, seq=seq, applied=applied)
    assert [t.seq for t in record.signals_taken] == [lost, 139]
    assert record.last_signal_seq == 139
    again = Run(LOOP, record, 3_000)
    assert again.on_signal("go", 2_000, seq=lost)
    assert record.steps["hold"].visit == 42  # 41 signals, 41 moves: `lost` not taken twice
    record, _ = started(LOOP)  # a fresh one: an instance enters at most 100 states
    for seq in range(200, 200 + SIGNALS_REMEMBERED + 5):
        Run(LOOP, record, 2_000).on_signal("go", 2_000, seq=seq)
    assert len(record.signals_taken) == SIGNALS_REMEMBERED
    assert Run(LOOP, record, 2_000).on_signal("go", 2_000)  # a direct call: no sequence
    assert taken_before(record, 0) is None


def test_a_signal_at_or_before_the_latest_judged_is_not_judged_again() -> None:
    """`go` at 10 taken (and kept: it answers as it did), then `nope` at 12 ignored, which
    moves the mark: 9, 11 and 12 are not judged again; 13 is; an ended instance's record is
    not written for a signal it ignores."""
    record, _ = started(LOOP)
    Run(LOOP, record, 2_000).on_signal("go", 2_000, seq=10)
    assert not handled_before(record, 10) and taken_before(record, 10) is not None
    assert judged(record, 12) and record.last_signal_seq == 12
    assert all(handled_before(record, seq) for seq in (9, 11, 12))
    assert not handled_before(record, 13) and not handled_before(record, 0)
    assert not judged(record, 12)
    Run(LOOP, record, 2_000).on_signal("stop", 2_000, seq=13)
    assert record.finished and not judged(record, 14)


def test_a_taken_signal_delivered_again_after_its_instance_ended_calls_for_its_ending() -> None:
    """`stop` ended the instance; delivered again, it says `signal_taken` again and calls
    for the ending again, which the outbox says only when its event is not stored: a
    coordinator killed between the record's write and the ending left an instance
    `completed` with no `workflow_completed` and no answer, for good (a drill, 9 of 25)."""
    record, _ = started(LOOP)
    Run(LOOP, record, 2_000).on_signal("stop", 2_000, seq=5)
    assert record.status == "completed"
    again = Run(LOOP, record, 3_000)
    assert again.on_signal("stop", 2_000, seq=5)
    kinds = [(type(a).__name__, getattr(a, "event", None)) for a in again.actions]
    assert kinds[-3:] == [
        ("Finish", None),
        ("Note", "workflow_completed"),
        ("Note", "signal_taken"),
    ]
    finish, end = again.actions[-3:-1]
    assert finish.again and end.unless_sent  # type: ignore[union-attr]


@contextlib.asynccontextmanager
async def keeping_deliveries(
    broker: Broker, **flows: str
) -> AsyncIterator[tuple[Handle, list[Delivery], ReachClient]]:
    """A coordinator of ``flows`` whose workflow deliveries are kept (to be delivered again
    by hand), its own handler, and alice."""
    config = msgspec.structs.replace(FAST, workflows=workflows(**flows))
    async with Broker(broker.url, names=broker.names, name="coordinator") as own:
        coordinator = Coordinator(own, config)
        handle, deliveries = coordinator.workflows.handle, list[Delivery]()

        async def keeping(msg: Delivery) -> float | None:
            deliveries.append(msg)
            return await handle(msg)

        coordinator.workflows.handle = keeping  # type: ignore[method-assign]
        async with coordinator.running(), ReachClient(broker=broker, name="alice") as alice:
            yield handle, deliveries, alice


def signal_of(deliveries: list[Delivery], event: str) -> list[Delivery]:
    return [d for d in deliveries if ".signal." in d.subject and f".{event}." in d.subject]


async def test_a_signal_delivered_again_as_new_is_not_taken_twice(broker):
    """`go` moved the machine from `first` to `second`, whose state takes `go` too. The
    server delivers that signal again, as new (delivery count 1, the same sequence), as
    one does that died before it applied the acknowledgement: it moved the machine on to
    `done` on one signal. It is known now, and moves nothing; a second `go` does."""
    async with keeping_deliveries(broker, steps=STEPS) as (handle, deliveries, alice):
        instance = new_id()
        invoked = asyncio.create_task(alice.invoke("steps", {}, message_id=instance))
        await _until_record(broker, instance, lambda r: r.current == "first")
        assert (await alice.signal_workflow(instance, "go")).state == "first"
        [go] = signal_of(deliveries, "go")
        assert go.num_delivered == 1
        assert await handle(delivered_again_as_new(go)) is None
        record = await read_record(broker, instance)
        assert record is not None and (record.current, record.status) == ("second", "running")
        assert (await alice.signal_workflow(instance, "go")).state == "second"
        assert await asyncio.wait_for(invoked, 10) == {"went": 2}
        events = await alice.status(instance)
    taken = [
        (e.detail["state"], e.detail["signal_seq"]) for e in events if e.event == "signal_taken"
    ]
    assert taken[0] == ("first", go.stream_seq) and [s for s, _ in taken] == ["first", "second"]
    assert not [e for e in events if e.event == "signal_ignored"]


async def test_a_signal_whose_acknowledgement_was_lost_is_known_after_many_newer(
    broker, monkeypatch: pytest.MonkeyPatch
):
    """A drill: one `flip` taken, the server killed before it applied the acknowledgement,
    then 40 `flip`s taken at once after the restart; the first came back 5 s later, as
    new, and flipped the machine a 42nd time on 41 signals (the last 32 taken were kept
    and it was not among them). Kept until its acknowledgement is applied, it is known."""
    monkeypatch.setattr(consumption, "RETRY_DELAY_S", 60.0)  # only the delivery by hand comes
    settled, lost = controls.settled, asyncio.Event()

    async def dying(msg: Delivery) -> None:
        if not lost.is_set():
            lost.set()
            raise BrokerError("the server died before it applied the acknowledgement")
        await settled(msg)

    monkeypatch.setattr(controls, "settled", dying)
    async with keeping_deliveries(broker, flipper=FLIPPER) as (handle, deliveries, alice):
        instance, _ = await alice.publish("flipper", {})
        await _until_record(broker, instance, lambda r: r.current == "a")
        assert (await alice.signal_workflow(instance, "flip")).taken
        for _ in range(40):
            assert (await alice.signal_workflow(instance, "flip")).taken
        first = signal_of(deliveries, "flip")[0]
        assert await handle(delivered_again_as_new(first)) is None
        record = await read_record(broker, instance)
        events = await alice.status(instance)
    assert record is not None and len(record.path) == 42  # a, then one state per signal
    taken = [e.detail["signal_seq"] for e in events if e.event == "signal_taken"]
    assert len(taken) == len(set(taken)) == 41


async def test_an_older_signal_is_not_taken_after_a_newer_one_was(broker):
    """`flop`, which state `a` does not take, then `flip`, which moved the machine to `b`.
    `flop` delivered again (its acknowledgement lost with the server, or its handling
    failed) was taken by `b`, after the newer `flip` (a drill), and said ignored and taken
    both. It was stored before `flip` was taken: it is not taken now, and said once."""
    async with keeping_deliveries(broker, flipper=FLIPPER) as (handle, deliveries, alice):
        instance, _ = await alice.publish("flipper", {})
        await _until_record(broker, instance, lambda r: r.current == "a")
        assert (await alice.signal_workflow(instance, "flop")).waits_for == ("flip", "stop")
        assert (await alice.signal_workflow(instance, "flip")).state == "a"
        [flop] = signal_of(deliveries, "flop")
        assert await handle(delivered_again_as_new(flop)) is None
        record = await read_record(broker, instance)
        events = await alice.status(instance)
    assert record is not None and record.current == "b"
    about_flop = [e for e in events if e.detail.get("signal_seq") == flop.stream_seq]
    assert [e.event for e in about_flop] == ["signal_ignored"]


async def test_a_taken_signal_forgotten_and_delivered_again_is_not_answered_again(broker):
    """`flip` taken and its acknowledgement applied (the record forgets it at the next
    write), `flip` again taken; the first delivered again (a server that restarted delivers
    what it had handed out again, beside a delivery still being handled) was answered
    "ignored, superseded" after "taken" (a drill: 198 times). Its `signal_taken` is in the
    instance's events: nothing more is said."""
    async with keeping_deliveries(broker, flipper=FLIPPER) as (handle, deliveries, alice):
        instance, _ = await alice.publish("flipper", {})
        await _until_record(broker, instance, lambda r: r.current == "a")
        assert (await alice.signal_workflow(instance, "flip")).state == "a"
        assert (await alice.signal_workflow(instance, "flip")).state == "b"
        first = signal_of(deliveries, "flip")[0]
        record = await read_record(broker, instance)
        assert record is not None and taken_before(record, first.stream_seq) is None
        assert await handle(delivered_again_as_new(first)) is None
        record = await read_record(broker, instance)
        events = await alice.status(instance)
    assert record is not None and record.current == "a" and len(record.path) == 3
    about_first = [e.event for e in events if e.detail.get("signal_seq") == first.stream_seq]
    assert about_first == ["signal_taken"]


async def test_an_ended_instance_is_not_answered_again_for_each_message_delivered_again(broker):
    """`stop` ended the instance. Every message of it delivered again after a crash (here
    a `flip` sent after the end, delivered a second time) resumed it, and an ended record
    calls for its answer: the starter was answered again each time (a drill: 2 to 5
    answers; a failed instance dead-lettered 86 times). Once its ending is said, no more."""
    async with keeping_deliveries(broker, flipper=FLIPPER) as (handle, deliveries, alice):
        box = broker.names.reply_box(alice.caller, new_id())
        task = alice.task("flipper", {}, reply_to=box)
        instance = task.message_id
        await alice.submit(task)
        await _until_record(broker, instance, lambda r: r.current == "a")
        assert (await alice.signal_workflow(instance, "stop")).taken
        record = await read_record(broker, instance)
        assert record is not None and record.status == "completed"
        answers: list[bytes] = []
        inbox = await broker.nc.subscribe(f"{box}.*", cb=_kept(answers))
        late = f"{broker.names.workflow_signal(instance, 'flip')}.{alice.caller}"
        await broker.publish(late, b"", headers=h.control_headers("signal"))  # after its end
        await eventually(lambda: bool(signal_of(deliveries, "flip")))
        [flip] = signal_of(deliveries, "flip")
        assert await handle(delivered_again_as_new(flip, count=2)) is None
        await broker.nc.flush()
        await inbox.unsubscribe()
    assert answers == []


def _kept(answers: list[bytes]):  # type: ignore[no-untyped-def]
    async def keep(msg) -> None:  # type: ignore[no-untyped-def]
        answers.append(msg.data)

    return keep


async def test_an_ending_a_crash_cut_short_is_said_when_its_signal_comes_again(
    broker, watcher, monkeypatch: pytest.MonkeyPatch
):
    """`stop` ended the instance (its record written `completed`), and the coordinator
    died before the ending was published. Its `stop` came back (unacknowledged), was known
    as taken, and did nothing more: the instance stayed `completed` with no
    `workflow_completed` and no answer, for good (a drill: 9 of 25 such kills)."""
    monkeypatch.setattr(consumption, "RETRY_DELAY_S", 60.0)  # only the hand-made delivery
    async with keeping_deliveries(broker, flipper=FLIPPER) as (handle, deliveries, alice):
        engine_broker = handle.__self__._broker  # type: ignore[attr-defined]
        publish, cut = engine_broker.publish, asyncio.Event()

        async def dying(subject: str, data: bytes, **options):  # type: ignore[no-untyped-def]
            if ".workflow_completed." in subject and not cut.is_set():
                cut.set()
                raise BrokerError("the coordinator died here")
            return await publish(subject, data, **options)

        monkeypatch.setattr(engine_broker, "publish", dying)
        task = alice.task("flipper", {})
        instance = task.message_id
        await alice.submit(task)
        await _until_record(broker, instance, lambda r: r.current == "a")
        subject = f"{broker.names.workflow_signal(instance, 'stop')}.{alice.caller}"
        await broker.publish(subject, b"", headers=h.control_headers("signal"))
        await asyncio.wait_for(cut.wait(), 10)
        record = await _until_record(broker, instance, lambda r: r.finished)
        handle.__self__._outbox._owed.clear()  # type: ignore[attr-defined]  # died: forgotten
        [stop] = signal_of(deliveries, "stop")
        await handle(delivered_again_as_new(stop, count=2))
        ended = await watcher.event("workflow_completed", message_id=instance)
    assert record.status == "completed" and ended.detail["path"] == ["a", "done"]


@pytest.mark.parametrize("direct_reads", ["current", "behind"])
async def test_two_replicas_take_a_burst_of_signals_in_the_order_stored(
    broker, watcher, monkeypatch: pytest.MonkeyPatch, direct_reads: str
):
    """40 `flip`s sent at once to a machine two replicas serve: the replicas share the
    consumer, and a later flip was often written first, the earlier then ignored as
    superseded (a drill: 19 of 40; 115 of 453 flips without any fault). Each waits for
    an earlier one of its instance still being handled: all 40 are taken, in order. The
    stream's leader is asked: a replica behind, answering direct gets, lacked signals
    stored the same millisecond (a re-drill on a 3-node cluster, one replica too)."""
    if direct_reads == "behind":
        batch = direct._batch

        async def behind(broker_, stream, request, **options):  # type: ignore[no-untyped-def]
            if stream == broker.names.workflows_stream:
                return [], 0
            return await batch(broker_, stream, request, **options)

        monkeypatch.setattr(direct, "_batch", behind)
    config = msgspec.structs.replace(FAST, workflows=workflows(flipper=FLIPPER))
    async with (
        Broker(broker.url, names=broker.names, name="coordinator") as one,
        Broker(broker.url, names=broker.names, name="coordinator") as two,
        Coordinator(one, config).running(),
        Coordinator(two, config).running(),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        instance, _ = await alice.publish("flipper", {})
        await _until_record(broker, instance, lambda r: r.current == "a")
        subject = f"{broker.names.workflow_signal(instance, 'flip')}.{alice.caller}"
        sent = [
            broker.publish(subject, b"", headers=h.control_headers("signal")) for _ in range(40)
        ]
        stored = [ack.seq for ack in await asyncio.gather(*sent)]
        record = await _until_record(broker, instance, lambda r: r.last_signal_seq == max(stored))
        await eventually(lambda: len(_about(watcher, "signal_taken", instance)) == 40)
    assert _about(watcher, "signal_ignored", instance) == []
    assert len(record.path) == 41
    visits = {
        e.detail["signal_seq"]: e.detail["visit"] for e in _about(watcher, "signal_taken", instance)
    }
    assert sorted(visits) == sorted(stored)
    assert [visits[seq] for seq in sorted(stored)] == sorted(visits.values())  # in stored order


async def test_a_signal_held_up_past_the_order_wait_goes_ahead_and_says_so(
    broker, watcher, monkeypatch: pytest.MonkeyPatch
):
    """The replica holding an earlier flip died with it (here: its first delivery comes
    back only after a second). The next flip waits ORDER_WAIT_S for it, then is taken, and
    the log says that it went ahead of which (a drill's 2 superseded of 5,599 left no line
    to tell a dead replica from a stalled one); the earlier one, back, is ignored as
    superseded by it."""
    monkeypatch.setattr(controls, "ORDER_WAIT_S", 0.2)
    config = msgspec.structs.replace(FAST, workflows=workflows(flipper=FLIPPER))
    async with Broker(broker.url, names=broker.names, name="coordinator") as own:
        coordinator = Coordinator(own, config)
        handle, held_back = coordinator.workflows.handle, asyncio.Event()

        async def dying_with_the_first_flip(msg: Delivery) -> float | None:
            if ".flip." in msg.subject and not held_back.is_set():
                held_back.set()
                return 1.0  # not acknowledged: delivered again in a second
            return await handle(msg)

        coordinator.workflows.handle = dying_with_the_first_flip  # type: ignore[method-assign]
        async with coordinator.running(), ReachClient(broker=broker, name="alice") as alice:
            instance, _ = await alice.publish("flipper", {})
            await _until_record(broker, instance, lambda r: r.current == "a")
            subject = f"{broker.names.workflow_signal(instance, 'flip')}.{alice.caller}"
            with capture_logs() as logs:
                first = await broker.publish(subject, b"", headers=h.control_headers("signal"))
                await asyncio.wait_for(held_back.wait(), 10)
                second = await broker.publish(subject, b"", headers=h.control_headers("signal"))
                ignored = await watcher.event("signal_ignored", message_id=instance)
    [ahead] = [e for e in logs if e["event"].startswith("signal handled before an earlier")]
    assert (ahead["signal_seq"], ahead["earlier_seq"]) == (second.seq, first.seq)
    [taken] = _about(watcher, "signal_taken", instance)
    assert taken.detail["signal_seq"] == second.seq
    assert ignored.detail["signal_seq"] == first.seq
    assert ignored.detail["superseded_by"] == second.seq


async def test_a_burst_to_one_instance_costs_about_one_leader_read_per_signal(
    broker, watcher, monkeypatch: pytest.MonkeyPatch
):
    """Each signal of a burst held here read the stream's leader again after each earlier
    one was done: a read per earlier signal of its batch, and a flood of ignored signals
    to one instance went at 36 a second where it had gone at 748. Each now waits for the
    latest earlier one held here, which waited for those before it."""
    reads: list[int] = []
    read = controls.leader_next_message

    async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(1)
        return await read(*args, **kwargs)

    monkeypatch.setattr(controls, "leader_next_message", counted)
    config = msgspec.structs.replace(FAST, workflows=workflows(flipper=FLIPPER))
    async with (
        Broker(broker.url, names=broker.names, name="coordinator") as own,
        Coordinator(own, config).running(),
        ReachClient(broker=broker, name="alice") as alice,
    ):
        instance, _ = await alice.publish("flipper", {})
        await _until_record(broker, instance, lambda r: r.current == "a")
        subject = f"{broker.names.workflow_signal(instance, 'nope')}.{alice.caller}"
        sent = [
            broker.publish(subject, b"", headers=h.control_headers("signal")) for _ in range(60)
        ]
        last = max(ack.seq for ack in await asyncio.gather(*sent))
        await _until_record(broker, instance, lambda r: r.last_signal_seq == last)
    assert len(reads) <= 2 * 60, len(reads)


def _about(watcher, kind: str, instance: str) -> list:  # type: ignore[no-untyped-def]
    return [e for e in watcher.events if e.event == kind and e.message_id == instance]
