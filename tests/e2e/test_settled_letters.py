"""A letter replayed or resolved already is settled: a worker started later does not hand it
to its handler, and ``replay`` refuses it unless forced, so its task does not run again."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach import LetterSettled
from agentreach.agents import Agent, Compensation, CompensationWorker, TaskContext
from agentreach.agents.letters import SETTLING, letter_state, replay, resolve, settling_of
from agentreach.broker import consumer_state, read_stream
from agentreach.broker.dead_letters import dead_letter, record_settling
from agentreach.broker.streams import last_message
from agentreach.dashboard import Board, History
from agentreach.envelopes import (
    DeadLetter,
    Event,
    Task,
    decode_task,
    encode,
    replay_id,
    server_answer,
)
from tests.cli.conftest import reach_argv, run
from tests.support import eventually, until_true


async def _letter(broker, message_id: str) -> DeadLetter:  # type: ignore[no-untyped-def]
    task = Task(v=1, message_id=message_id, trace_id=message_id, topic="chores")
    return await dead_letter(
        broker,
        reason="no_route",
        task=task,
        message_id=message_id,
        trace_id=message_id,
        topic="chores",
    )


def _runner(runs: list[str], *topics: str) -> Agent:
    """An agent serving ``topics`` (default: chores) that notes each run as `topic id`."""
    agent = Agent("chore-runner", startup_delay=0)

    async def run(ctx: TaskContext, payload: object) -> str:
        runs.append(f"{ctx.topic} {ctx.message_id}")
        return "done"

    for topic in topics or ("chores",):
        agent.handler(topic)(run)
    return agent


async def _drained(broker, worker: str) -> None:  # type: ignore[no-untyped-def]
    async def done() -> bool:
        state = await consumer_state(broker, broker.names.dlq_stream, f"compensation-{worker}")
        return state is not None and state.num_pending == state.num_ack_pending == 0

    await until_true(done)


async def test_a_new_worker_replays_only_the_open_letter(broker, watcher):
    """A resolved letter and a replayed one are acknowledged and logged by a worker deployed
    after they were settled, and not replayed; the open one is handed over and replayed.
    With include_settled=True every one is handed over, and comp.replay refuses the settled
    ones (LetterSettled), the worker acknowledging them."""
    resolved, replayed, _ = [
        await _letter(broker, m) for m in ("late-resolved", "late-replayed", "late-open")
    ]
    await resolve(broker, resolved, "refunded by hand", by="operator")
    await replay(broker, replayed)
    await watcher.event("replayed", message_id="late-replayed")
    handed: list[str] = []

    async def replay_everything(letter: DeadLetter, comp: Compensation) -> None:
        handed.append(letter.message_id)
        await comp.replay(letter)

    with capture_logs() as logs:
        async with CompensationWorker("late-worker", replay_everything).running(broker=broker):
            await watcher.event("replayed", message_id="late-open")
            await _drained(broker, "late-worker")
    assert handed == ["late-open"]
    skipped = {x["message_id"]: x for x in logs if x["event"].startswith("dead letter skipped")}
    assert skipped["late-resolved"]["state"] == "resolved"
    assert skipped["late-resolved"]["by"] == "operator"
    assert skipped["late-replayed"]["state"] == "replayed"
    assert set(skipped) == {"late-resolved", "late-replayed"}
    assert watcher.count("replayed", {"late-resolved"}) == 0
    assert watcher.count("replayed", {"late-replayed"}) == 1  # the one by hand, no other
    handed.clear()
    with capture_logs() as logs:
        worker = CompensationWorker("every", replay_everything, include_settled=True)
        async with worker.running(broker=broker):
            await _drained(broker, "every")
    assert sorted(handed) == ["late-open", "late-replayed", "late-resolved"]
    refused = [x for x in logs if x["event"].startswith("replay refused, the dead letter is")]
    assert {x["message_id"] for x in refused} == set(handed)
    assert watcher.count("replayed") == 2


async def test_replay_refuses_a_settled_letter_unless_forced(broker, watcher):
    """Replaying a letter replayed already raises LetterSettled naming the letter, its
    state, who and when, publishing nothing; so does one resolved; forced, each is replayed,
    and every forced replay of one letter records its own replayed event (the last one judges)."""
    letter = await _letter(broker, "twice")
    first = await replay(broker, letter, sender="ops-worker")
    with pytest.raises(LetterSettled) as refused:
        await replay(broker, letter)
    error = refused.value
    assert (error.message_id, error.state, error.by) == ("twice", "replayed", "ops-worker")
    assert "twice (no_route, topic chores) not replayed: it is replayed already" in str(error)
    assert ", by ops-worker at " in str(error)
    assert f"(as {first.message_id})" in str(error)
    intake = broker.names.task("chores", "ops-worker")
    assert len(await read_stream(broker, broker.names.tasks_stream, intake)) == 1
    await replay(broker, letter, force=True)
    await replay(broker, letter, force=True)
    await eventually(lambda: watcher.count("replayed", {"twice"}) == 3)
    assert [e.event for e in await settling_of(broker, letter)] == ["replayed"]  # the last one
    other = await _letter(broker, "closed")
    await resolve(broker, other, "done", by="alice")
    with pytest.raises(LetterSettled, match=r"it is resolved already, by alice at .*'done'"):
        await replay(broker, other)
    assert (await replay(broker, other, force=True)).replay_of == "closed"


async def test_a_server_answer_written_after_a_settling_does_not_reopen_the_letter(broker, watcher):
    """Anyone may have the server write its answer to a request onto the subject of a
    letter's `replayed` record: read as its last, it reopened the letter, which was then
    replayed again (a security re-test). The last readable record still settles it."""
    letter = await _letter(broker, "reopened")
    await replay(broker, letter, sender="ops-worker")
    subject = f"{broker.names.prefix}.settled.replayed.chores.reopened.reopened.mallory"
    await broker.nc.publish("$JS.API.STREAM.NAMES", b"", reply=subject)
    await until_true(lambda: _held(broker, subject))
    with pytest.raises(LetterSettled, match="it is replayed already, by ops-worker"):
        await replay(broker, letter)


async def test_a_direct_get_answer_of_a_settling_record_a_party_wrote_settles_nothing(
    broker, watcher
):
    """An agent may write what it likes under a key of its own, and direct-get it with the
    reply aimed at a letter's settled subject: a forged `resolved` record, which a direct get
    reads back with the server's headers in place of the stored ones (a security re-test).
    The stored ones are still in the header block, before the server's: the letter stays
    open."""
    template = await _letter(broker, "template")
    await resolve(broker, template, "done", by="ops")
    names = broker.names
    kept = names.settled_of_message_of_kind("resolved", "template", "template")
    await until_true(lambda: _held(broker, kept))
    record = await last_message(broker, names.settled_stream, kept)
    own = f"$KV.{names.executions_bucket}.x.t.mallory"
    await broker.publish(own, record.data.replace(b"template", b"victim"))
    victim = await _letter(broker, "victim")
    aimed = f"{names.prefix}.settled.resolved.chores.victim.victim.mallory"
    direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
    await broker.nc.publish(direct, b"", reply=aimed)
    await until_true(lambda: _held(broker, aimed))
    stored = await last_message(broker, names.settled_stream, aimed)
    said = server_answer(stored.data, stored.headers) or ""
    assert f"a JetStream direct get's answer (a message of KV_{names.executions_bucket}" in said
    assert await settling_of(broker, victim) == []
    assert (await replay(broker, victim)).replay_of == "victim"


async def _held(broker, subject: str) -> bool:  # type: ignore[no-untyped-def]
    last = await last_message(broker, broker.names.settled_stream, subject)
    return last is not None


async def test_replays_of_one_letter_that_race_run_its_task_once(broker, coordinator, watcher):
    """Two workers replaying one open letter at the same moment both find it open; their
    replays carry the letter's one replay id, so the stream keeps one and the task runs
    once. A forced replay is a message of its own."""
    letter = await _letter(broker, "raced")
    runs: list[str] = []
    agent = _runner(runs)

    async with agent.running(broker=broker):
        first, second = await asyncio.gather(
            replay(broker, letter, sender="ops-a"), replay(broker, letter, sender="ops-b")
        )
        assert first.message_id == second.message_id == replay_id(letter.at_ms, None, "raced", 0)
        await watcher.event("completed", message_id=first.message_id)
        forced = await replay(broker, letter, force=True)
        assert forced.message_id != first.message_id
        await watcher.event("completed", message_id=forced.message_id)
    assert runs == [f"chores {first.message_id}", f"chores {forced.message_id}"]
    assert watcher.count("routed", {first.message_id}) == 1


async def test_a_letter_stays_settled_after_its_trace_expires(broker, watcher):
    """REACH_EVENTS keeps a week, the letters a month: with the replayed and resolved events
    gone from the trace (purged here, as a week does), the letters are still settled. A
    worker deployed then skips them, replay refuses them, `reach dlq list --open` leaves
    them out, and the dashboard's board calls them replayed and resolved."""
    replayed, resolved, _ = [await _letter(broker, m) for m in ("old-1", "old-2", "old-open")]
    await replay(broker, replayed, sender="ops-worker")
    await resolve(broker, resolved, "refunded by hand", by="alice")
    await eventually(lambda: watcher.count("replayed") + watcher.count("resolved") == 2)
    names = broker.names
    for kind in SETTLING:
        await broker.js.purge_stream(names.events_stream, subject=names.events_of_kind(kind))
    assert await read_stream(broker, names.events_stream, names.events_of_kind("replayed")) == []
    assert [e.event for e in await settling_of(broker, replayed)] == ["replayed"]
    with pytest.raises(LetterSettled, match="resolved already, by alice"):
        await replay(broker, resolved)
    listed = await run(*reach_argv(broker, "dlq", "list", "--open"))
    assert listed.returncode == 0, listed.stderr
    assert "old-open" in listed.stdout and "old-1" not in listed.stdout
    assert "old-2" not in listed.stdout
    async with Board(broker, History(), version="test") as board:
        states = {m: letter_state(board.settling.get(m)) for m in ("old-1", "old-2", "old-open")}
    assert states == {"old-1": "replayed", "old-2": "resolved", "old-open": "open"}
    handed: list[str] = []

    async def replay_everything(letter: DeadLetter, comp: Compensation) -> None:
        handed.append(letter.message_id)
        await comp.replay(letter)

    async with CompensationWorker("month-later", replay_everything).running(broker=broker):
        await _drained(broker, "month-later")
    assert handed == ["old-open"]


async def _replayed_without_record(broker, letter: DeadLetter, sender: str | None) -> Task:  # type: ignore[no-untyped-def]
    """A replay whose replayer stopped before recording ``replayed``: published, no more."""
    with pytest.MonkeyPatch.context() as patch:

        async def crashed(*args: object, **kwargs: object) -> None:
            raise asyncio.CancelledError  # the process ends here

        patch.setattr("agentreach.agents.letters.record_settling", crashed)
        with pytest.raises(asyncio.CancelledError):
            await replay(broker, letter, sender=sender)
    names = broker.names
    stored = await read_stream(broker, names.tasks_stream, names.task(letter.topic, sender))
    return decode_task(stored[-1].data)


async def test_a_replay_made_again_by_another_replayer_after_the_dedup_window_runs_once(
    broker, coordinator, watcher
):
    """A worker replays a letter as itself and stops before recording it; past the stream's
    dedup window an operator replays the letter, still open, bare. Same replay id, another
    caller: the run-once record of the first answers it, and the task does not run again
    (it ran twice: each caller's records were their own)."""
    names = broker.names
    info = await broker.js.stream_info(names.tasks_stream)
    info.config.duplicate_window = 0.5  # the 2 minutes, shortened
    await broker.js.update_stream(info.config)
    letter = await _letter(broker, "twice-replayed")
    runs: list[str] = []
    agent = _runner(runs)

    async with agent.running(broker=broker):
        first = await _replayed_without_record(broker, letter, sender="ops-worker")
        await watcher.event("completed", message_id=first.message_id)
        assert letter_state(await settling_of(broker, letter)) == "open"
        await asyncio.sleep(0.6)  # past the shortened dedup window
        again = await replay(broker, letter)  # an operator: bare, no caller
        assert again.message_id == first.message_id
        await watcher.event("answered_from_record", message_id=again.message_id)
    assert runs == [f"chores {first.message_id}"]


async def test_a_replay_of_another_caller_s_message_is_not_sent_its_result(
    broker, coordinator, watcher
):
    """Anyone may say `replay_of`, and a replay's run-once read looks at every sender's
    records: mallory sent a task under alice's message id, saying it replays something,
    and read alice's result in the `completed` of her own trace. Another sender's run still
    ends hers (it must not run twice), with its result withheld."""
    names = broker.names
    runs: list[str] = []
    alice = Task(
        v=1, message_id="secret-1", trace_id="secret-1", topic="chores", caller="alice",
        payload={"card": "4111"},
    )  # fmt: skip
    forged = msgspec.structs.replace(alice, trace_id="mallory-t", caller="mallory", replay_of="x")

    def in_her_trace() -> list[Event]:
        return [e for e in watcher.events if e.event == "completed" and e.trace_id == "mallory-t"]

    async with _runner(runs).running(broker=broker):
        await broker.publish(names.task("chores", "alice"), encode(alice))
        await watcher.event("completed", message_id="secret-1")
        await broker.publish(names.task("chores", "mallory"), encode(forged))
        await eventually(in_her_trace)
    [done] = in_her_trace()
    assert runs == ["chores secret-1"]
    assert done.detail.get("from_record") is True
    assert "duration_ms" not in done.detail  # nor how long another sender's run took
    assert "result" not in done.detail and "result_ref" not in done.detail
    assert done.detail["result_withheld"] == "the run was another sender's"


async def test_a_replay_to_another_topic_is_a_message_of_its_own(broker, coordinator, watcher):
    """A letter replayed to its topic (the replayer stopped before recording it), then sent
    by a person to another topic: the second is not the first's duplicate (it was dropped
    by the stream, and recorded as replayed there all the same), and runs where sent."""
    letter = await _letter(broker, "redirected")
    runs: list[str] = []
    agent = _runner(runs, "chores", "review")

    async with agent.running(broker=broker):
        first = await _replayed_without_record(broker, letter, sender=None)
        redirected = await replay(broker, letter, topic="review")
        assert redirected.message_id != first.message_id
        assert redirected.message_id == replay_id(
            letter.at_ms, None, "redirected", 0, to_topic="review"
        )
        for message_id in (first.message_id, redirected.message_id):
            await watcher.event("completed", message_id=message_id)
    assert sorted(runs) == sorted([f"chores {first.message_id}", f"review {redirected.message_id}"])


async def test_a_handler_that_raised_after_its_replay_is_called_again_and_replays_nothing(
    broker, coordinator, watcher, monkeypatch
):
    """A handler replays, then its next step fails (a notification): the letter comes back
    to it, settled by this very worker, and is handed over again (it was skipped as settled,
    its next step lost); its replay returns the one it made, and the task runs once."""
    monkeypatch.setattr("agentreach.agents.compensation.RETRY_DELAY_S", 0.2)
    await _letter(broker, "notify-after")
    runs: list[str] = []
    replays: list[str] = []
    agent = _runner(runs)

    async def replay_then_notify(letter: DeadLetter, comp: Compensation) -> None:
        replays.append((await comp.replay(letter)).message_id)
        if len(replays) == 1:
            raise RuntimeError("the notification service is down")

    worker = CompensationWorker("notifier", replay_then_notify)
    async with agent.running(broker=broker), worker.running(broker=broker):
        await _drained(broker, "notifier")
        await watcher.event("completed", message_id=replays[0])
    assert replays == [replays[0]] * 2
    assert runs == [f"chores {replays[0]}"]
    assert watcher.count("replayed") == 1


async def test_a_worker_cannot_settle_a_letter_in_another_worker_s_name(broker):
    """A worker recorded `replayed` with `by` naming another worker and that worker's own
    replay id: that worker's replay then believed it had been made, sent nothing, and the
    task never ran, the dashboard crediting it. `by` is the sender's own token (an
    operator's and the coordinator's name a person or a reason)."""
    letter = await _letter(broker, "not-mine")
    carol_s = replay_id(letter.at_ms, None, letter.message_id, letter.replays)
    await record_settling(
        broker, letter, "replayed", sender="mallory", by="carol", replayed_as=carol_s
    )
    [settled] = await settling_of(broker, letter)
    assert settled.detail["by"] == "mallory"
    with pytest.raises(LetterSettled):
        await replay(broker, letter, sender="carol")
