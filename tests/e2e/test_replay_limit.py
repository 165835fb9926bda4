"""A replay carries how many replays led to it, and a task replayed ``max_replays`` times
is not replayed again unless forced: a worker that replays the letters its own replays
cause stops, instead of replaying without end."""

from __future__ import annotations

import itertools

import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import AgentConfigError, Compensation, CompensationWorker, ReachClient
from agentreach.agents.errors import NothingToReplay, ReplayLimitReached
from agentreach.agents.letters import replay
from agentreach.broker import consumer_state, read_stream
from agentreach.broker.dead_letters import dead_letter
from agentreach.envelopes import DeadLetter
from tests.support import until_true


async def test_a_worker_replaying_its_own_no_route_letters_stops_at_the_limit(
    broker, coordinator, watcher
):
    """A worker replays every no_route letter of a topic nobody serves: three replays (each
    one more in ``replays``), then the fourth letter, whose task three replays led to, is
    refused, logged with its id and count, acknowledged and left open; nothing more is
    published. Without the limit it went on without end."""

    async def replay_everything(letter: DeadLetter, comp: Compensation) -> None:
        await comp.replay(letter)

    worker = CompensationWorker("looper", replay_everything, reasons=["no_route"])
    with capture_logs() as logs:
        async with worker.running(broker=broker), ReachClient(broker=broker) as client:
            first_id, trace_id = await client.publish("nobody_serves_this", {"n": 1})

            async def refused() -> list[dict]:
                return [log for log in logs if log["event"].startswith("replay refused")]

            [log] = await until_true(refused, timeout=30.0)

            async def settled() -> bool:
                state = await consumer_state(broker, broker.names.dlq_stream, "compensation-looper")
                return state is not None and state.num_pending == state.num_ack_pending == 0

            await until_true(settled)
            assert len(await refused()) == 1
    stored = await read_stream(broker, broker.names.dlq_stream, broker.names.dlq_wildcard)
    letters = [envelopes.decode_dead_letter(m.data) for m in stored]
    assert [x.replays for x in letters] == [0, 1, 2, 3]
    assert {x.trace_id for x in letters} == {trace_id} and letters[0].message_id == first_id
    for before, after in itertools.pairwise(letters):
        assert after.envelope is not None and after.envelope.replay_of == before.message_id
    last = letters[-1]
    assert log["log_level"] == "error"
    assert (log["message_id"], log["replays"], log["max_replays"]) == (last.message_id, 3, 3)
    assert watcher.count("replayed") == 3
    assert watcher.count("replayed", {last.message_id}) == 0  # open, for a person


async def test_replay_past_the_limit_is_refused_naming_the_letter_unless_forced(broker):
    """``replay`` of a letter whose task two replays led to, with max_replays=2: a
    ReplayLimitReached naming the letter and the count, nothing published; forced, it is
    replayed, with replays 3."""
    task = envelopes.Task(
        v=1, message_id="again-2", trace_id="again", topic="flaky", replays=2, replay_of="again-1"
    )
    letter = await dead_letter(
        broker, reason="no_route", task=task, message_id="again-2", trace_id="again", topic="flaky"
    )
    with pytest.raises(ReplayLimitReached, match=r"again-2 .* replayed 2 times") as refused:
        await replay(broker, letter, max_replays=2)
    assert (refused.value.message_id, refused.value.replays) == ("again-2", 2)
    intake = broker.names.task("flaky")
    assert await read_stream(broker, broker.names.tasks_stream, intake) == []
    forced = await replay(broker, letter, max_replays=2, force=True)
    [sent] = await read_stream(broker, broker.names.tasks_stream, intake)
    assert envelopes.decode_task(sent.data) == forced
    assert (forced.replays, forced.replay_of) == (3, "again-2")


def test_a_worker_refuses_a_max_replays_that_is_no_count():
    """max_replays must be an int ≥ 0: the option is named when the worker is built."""

    async def handle(letter: DeadLetter, comp: Compensation) -> None:
        return None

    for wrong in (-1, 2.5, True):
        with pytest.raises(AgentConfigError, match="max_replays"):
            CompensationWorker("w", handle, max_replays=wrong)  # type: ignore[arg-type]


async def test_a_worker_replaying_every_reason_leaves_a_letter_without_a_task_to_a_person(
    broker, coordinator, watcher
):
    """A worker of every reason that replays what it gets is handed an invalid_envelope
    letter once: comp.replay raises NothingToReplay (forced too), and the worker
    acknowledges the letter and logs that it is left open, instead of retrying it every 5 s
    for the letter's 30 days."""
    await broker.publish(broker.names.task("chores"), b'{"text": ', headers={"Nats-Msg-Id": "torn"})
    letter = await watcher.dead_letter("invalid_envelope", message_id="torn")
    with pytest.raises(NothingToReplay) as refused:
        await replay(broker, letter, force=True)
    assert (refused.value.message_id, refused.value.reason) == ("torn", "invalid_envelope")
    assert "fix its body" in str(refused.value) and "--payload" in str(refused.value)
    handed: list[str] = []

    async def replay_everything(letter: DeadLetter, comp: Compensation) -> None:
        handed.append(letter.message_id)
        await comp.replay(letter)

    with capture_logs() as logs:
        async with CompensationWorker("everything", replay_everything).running(broker=broker):

            async def settled() -> bool:
                dlq = broker.names.dlq_stream
                state = await consumer_state(broker, dlq, "compensation-everything")
                return state is not None and state.num_pending == state.num_ack_pending == 0

            await until_true(settled)
    assert handed == ["torn"]
    [said] = [x for x in logs if x["event"].startswith("replay refused, the dead letter holds")]
    assert said["message_id"] == "torn" and said["log_level"] == "error"


async def test_a_letter_without_a_task_is_replayed_with_the_payload_it_should_have_had(
    broker, coordinator, watcher
):
    """Malformed JSON on `reach.task.chores`: its topic is known (the subject's), so a
    replay given the payload it should have had sends that, in the letter's trace."""
    await broker.publish(broker.names.task("chores"), b'{"text": ', headers={"Nats-Msg-Id": "cut"})
    letter = await watcher.dead_letter("invalid_envelope", message_id="cut")
    sent = await replay(broker, letter, payload={"text": "mended"})
    assert (sent.topic, sent.payload, sent.replay_of) == ("chores", {"text": "mended"}, "cut")
    routed = await watcher.dead_letter("no_route", message_id=sent.message_id)  # nobody serves it
    assert routed.envelope is not None and routed.envelope.payload == {"text": "mended"}
