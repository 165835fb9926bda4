"""`reach dlq`: which letters are open, resolving one from the shell, a table that stays
aligned."""

from __future__ import annotations

import asyncio
import json

import msgspec

from agentreach import envelopes
from agentreach.agents import Compensation, CompensationWorker
from agentreach.broker import Topology, provision, read_stream
from agentreach.broker.limits import StorageLimits
from agentreach.envelopes import DeadLetter, ErrorInfo, Task, WorkflowStep
from tests.cli.conftest import reach_argv, run
from tests.support import eventually, letter_of

STEP_ID = "01a238a5-7c1e-7d2a-9f00-3c5be8a1d0f2-research-1"  # a workflow step's message id

# What a dead letter carries at least (the coordinator's have their Nats-Msg-Id): one with
# no headers is taken for a direct get's answer asking for none.
LETTERED = {"Reach-Trace-Id": "letter"}


async def reach(broker, *args: str):  # type: ignore[no-untyped-def]
    return await run(*reach_argv(broker, *args))


async def _lost(broker, watcher, message_id: str, topic: str = "nobody_serves_this") -> None:  # type: ignore[no-untyped-def]
    sent = await reach(broker, "publish", topic, "{}", "--message-id", message_id)
    assert sent.returncode == 0, sent.stderr
    await watcher.dead_letter("no_route", message_id=message_id)


async def test_list_shows_each_letters_state_and_open_lists_only_open_ones(
    broker, coordinator, watcher
):
    """A letter a worker resolved says resolved, one replayed says replayed, the rest open;
    --open lists only those; a long workflow step id keeps every column aligned."""

    async def settle(letter: DeadLetter, comp: Compensation) -> None:
        await comp.resolve(letter, "refunded by hand")

    worker = CompensationWorker("settles", settle, topics=["settled_by_worker"])
    async with worker.running(broker=broker):
        await _lost(broker, watcher, "by-worker", topic="settled_by_worker")
        await watcher.event("resolved", message_id="by-worker")
    await _lost(broker, watcher, "replayed-1")
    await _lost(broker, watcher, STEP_ID)
    replayed = await reach(broker, "dlq", "replay", "replayed-1")
    assert replayed.returncode == 0, replayed.stderr
    await watcher.event("replayed", message_id="replayed-1")
    listed = await reach(broker, "dlq", "list")
    only_open = await reach(broker, "dlq", "list", "--open")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    states = {row.split()[0]: row.split()[4] for row in rows}
    assert states.pop("by-worker") == "resolved" and states.pop("replayed-1") == "replayed"
    assert set(states.values()) == {"open"}  # the step's, and the replay's own (no route)
    for column in ("AT", "REASON", "TOPIC", "STATE", "ERROR"):
        at = header.index(column)
        assert all(row[at - 2 : at] == "  " and row[at] != " " for row in rows), listed.stdout
    assert [row.split()[0] for row in only_open.stdout.splitlines()[1:]] == list(states)


async def test_resolve_records_what_a_worker_records_once(broker, coordinator, watcher):
    """`reach dlq resolve ID --note …` records a resolved event with the note and who, as a
    worker's comp.resolve does; the letter is then resolved, and resolving it again, or
    without a note, is refused in one line."""
    await _lost(broker, watcher, "by-hand")
    bare = await reach(broker, "dlq", "resolve", "by-hand")
    done = await reach(broker, "dlq", "resolve", "by-hand", "--note", "called the customer")
    assert done.returncode == 0, done.stderr
    resolved = await watcher.event("resolved", message_id="by-hand")
    again = await reach(broker, "dlq", "resolve", "by-hand", "--note", "twice")
    opened = await reach(broker, "dlq", "list", "--open")
    assert bare.returncode == 2 and "needs --note" in bare.stderr  # a missing argument
    # Said as argparse says its own: the command, and where its help is (a fresh reader).
    assert (
        bare.stderr.startswith("reach dlq: error: ") and "(see `reach dlq --help`)" in bare.stderr
    )
    assert done.stdout.startswith("by-hand: resolved (was open), by ")
    assert resolved.detail["note"] == "called the customer" and resolved.detail["by"]
    assert resolved.trace_id == "by-hand" and resolved.topic == "nobody_serves_this"
    assert again.returncode == 1 and "by-hand is resolved already" in again.stderr
    assert opened.stdout.strip() == "no open dead letters"


async def test_a_step_letter_its_workflow_handles_is_listed_handled_not_open(broker):
    """A branch that ran past its `timeout_s` with `on_timeout: partial` is still
    dead-lettered, but its workflow absorbed it: `reach dlq list` says handled, and
    `--open` leaves it out, as a compensation worker does."""
    names = broker.names
    for message_id, handled in (("absorbed-research-1", True), ("undo-failed-refund-1", False)):
        letter = DeadLetter(
            v=1,
            reason="expired",
            message_id=message_id,
            trace_id=message_id,
            topic="research",
            error=ErrorInfo(type="expired", message="ttl passed", retryable=False),
            workflow=WorkflowStep(instance_id="study-1", step="research", handled=handled),
        )
        await broker.publish(
            names.dlq("expired", "research"), envelopes.encode(letter), headers=LETTERED
        )
    listed = await reach(broker, "dlq", "list")
    only_open = await reach(broker, "dlq", "list", "--open")
    assert listed.returncode == 0, listed.stderr
    states = {row.split()[0]: row.split()[4] for row in listed.stdout.splitlines()[1:]}
    assert states == {"absorbed-research-1": "handled", "undo-failed-refund-1": "open"}
    assert [row.split()[0] for row in only_open.stdout.splitlines()[1:]] == ["undo-failed-refund-1"]


async def test_a_replay_the_intake_refuses_says_why_in_one_line(broker):
    """`reach dlq replay` into a topic whose bare intake subject holds its whole backlog
    (no coordinator has taken it) fails in one line that names the subject and the limit,
    without a traceback, and records no `replayed` event."""
    names = broker.names
    await provision(broker, Topology.default(names, limits=StorageLimits(tasks_per_subject=1)))
    await broker.publish(names.task("full_topic"), b'{"waiting": true}')
    task = Task(v=1, message_id="refused-1", trace_id="refused-1", topic="full_topic")
    letter = DeadLetter(
        v=1,
        reason="no_route",
        message_id="refused-1",
        trace_id="refused-1",
        topic="full_topic",
        envelope=task,
        error=ErrorInfo(type="no_route", message="nobody served it", retryable=True),
    )
    await broker.publish(
        names.dlq("no_route", "full_topic"), envelopes.encode(letter), headers=LETTERED
    )
    refused = await reach(broker, "dlq", "replay", "refused-1")
    listed = await reach(broker, "dlq", "list")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("reach: error: refused-1 was not replayed")
    assert names.task("full_topic") in line and "limits.tasks_per_subject" in line
    assert listed.stdout.splitlines()[1].split()[4] == "open"  # not replayed


async def test_replay_of_a_letter_replayed_max_replays_times_is_refused_unless_forced(broker):
    """`reach dlq replay ID` of a letter whose task 3 replays led to: one line naming the
    letter, the count and --force, exit 1, nothing sent; `--max-replays 4` or `--force`
    replays it (one more in `replays`); --force is refused for other actions."""
    names = broker.names
    task = envelopes.Task(v=1, message_id="thrice", trace_id="first", topic="flaky", replays=3)
    letter = DeadLetter(
        v=1, reason="no_route", message_id="thrice", trace_id="first", topic="flaky", envelope=task
    )
    await broker.publish(names.dlq("no_route", "flaky"), envelopes.encode(letter), headers=LETTERED)
    refused = await reach(broker, "dlq", "replay", "thrice")
    assert refused.returncode == 1
    [line] = refused.stderr.splitlines()
    assert "thrice (no_route, topic flaky) not replayed" in line
    assert "replayed 3 times already (--max-replays 3); --force replays it anyway" in line
    assert await read_stream(broker, names.tasks_stream, names.task("flaky")) == []
    for allowed in (("--max-replays", "4"), ("--force",)):
        replayed = await reach(broker, "dlq", "replay", "thrice", *allowed)
        assert replayed.returncode == 0, replayed.stderr
    sent = await read_stream(broker, names.tasks_stream, names.task("flaky"))
    assert [envelopes.decode_task(m.data).replays for m in sent] == [4, 4]
    misplaced = await reach(broker, "dlq", "list", "--force")
    assert misplaced.returncode != 0 and "--force is for dlq replay" in misplaced.stderr


async def test_replay_of_a_settled_letter_is_refused_in_one_line_unless_forced(
    broker, coordinator, watcher
):
    """`reach dlq replay ID` of a letter replayed already, or resolved: one line naming the
    letter, its state, who and when, exit 1, nothing sent; `--force` replays it."""
    await _lost(broker, watcher, "done-once")
    await _lost(broker, watcher, "done-by-hand")
    first = await reach(broker, "dlq", "replay", "done-once")
    assert first.returncode == 0, first.stderr
    resolved = await reach(broker, "dlq", "resolve", "done-by-hand", "--note", "paid back")
    assert resolved.returncode == 0, resolved.stderr
    await watcher.event("replayed", message_id="done-once")
    await watcher.event("resolved", message_id="done-by-hand")
    again = await reach(broker, "dlq", "replay", "done-once")
    closed = await reach(broker, "dlq", "replay", "done-by-hand")
    for refused, state in ((again, "replayed"), (closed, "resolved")):
        assert refused.returncode == 1, refused.stdout
        [line] = refused.stderr.splitlines()
        assert f"not replayed: it is {state} already, by " in line, line
        assert line.endswith("; --force replays it anyway"), line
    assert "paid back" in closed.stderr
    assert watcher.count("replayed", {"done-once"}) == 1
    assert watcher.count("replayed", {"done-by-hand"}) == 0
    forced = await reach(broker, "dlq", "replay", "done-once", "--force")
    assert forced.returncode == 0, forced.stderr
    await eventually(lambda: watcher.count("replayed", {"done-once"}) == 2)
    traced = await reach(broker, "trace", "done-by-hand")
    [line] = [x for x in traced.stdout.splitlines() if " resolved " in x]
    assert " operator" in line and "coordinator" not in line, line


async def test_resolve_open_settles_every_open_letter_of_a_topic_at_once(
    broker, coordinator, watcher
):
    """45 letters resolved one process each took an operator 65 s: `reach dlq resolve --open
    --topic T --note …` resolves every open one of the topic, and no other; without a filter
    it refuses."""
    for n in range(3):
        await _lost(broker, watcher, f"pile-{n}", topic="piled_up")
    await _lost(broker, watcher, "elsewhere-1", topic="not_this_one")
    unfiltered = await reach(broker, "dlq", "resolve", "--open", "--note", "all of it")
    done = await reach(
        broker, "dlq", "resolve", "--open", "--topic", "piled_up", "--note", "refunded in bulk"
    )
    again = await reach(
        broker, "dlq", "resolve", "--open", "--topic", "piled_up", "--note", "twice?"
    )
    await eventually(lambda: watcher.count("resolved") >= 3)
    listed = await reach(broker, "dlq", "list", "--open")
    assert unfiltered.returncode == 1 and "give one" in unfiltered.stderr, unfiltered.stderr
    assert done.returncode == 0 and done.stdout.startswith("3 open letter(s) resolved"), done
    assert again.stdout.startswith("0 open letter(s) resolved"), again.stdout
    resolved = {e.message_id for e in watcher.events if e.event == "resolved"}
    assert resolved == {"pile-0", "pile-1", "pile-2"}
    open_now = [row.split()[0] for row in listed.stdout.splitlines()[1:]]
    assert "elsewhere-1" in open_now and not any(m.startswith("pile-") for m in open_now)


async def test_a_later_life_of_a_message_id_dead_lettered_again_is_a_letter_of_its_own(broker):
    """The id sent again past the intake's duplicate window is another life of it: failing
    again, its letter was dropped as a copy of the first life's (the DLQ deduplicates for an
    hour) while its caller was told `reach dlq show`. Both are kept; resolving the first
    leaves the second open, and `dlq show` shows the second."""
    first = Task(v=1, message_id="again-1", trace_id="again-1", topic="t", received_ms=1_000)
    later = msgspec.structs.replace(first, received_ms=200_000)
    error = ErrorInfo(type="ValueError", message="still wrong")
    await letter_of(broker, first, "retries_exhausted", error=error)
    resolved = await reach(broker, "dlq", "resolve", "again-1", "--note", "fixed by hand")
    await letter_of(broker, later, "retries_exhausted", error=error)
    stored = await read_stream(broker, broker.names.dlq_stream, broker.names.dlq_wildcard)
    listed = await reach(broker, "dlq", "list", "--open", "--json")
    shown = await reach(broker, "dlq", "show", "again-1")
    assert resolved.returncode == 0, resolved.stderr
    assert len(stored) == 2
    [open_one] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert open_one["message_id"] == "again-1"
    letter = json.loads(shown.stdout)
    assert letter["envelope"]["received_ms"] == 200_000 and letter["letter_state"] == "open"
    assert "state" not in letter  # a failed workflow's record: `null` read as the letter's
    assert letter["trace"] == []  # not the first life's settling
    assert "again-1 has 2 dead letters (at_ms " in shown.stderr
    again = await reach(broker, "dlq", "resolve", "again-1", "--note", "the second one too")
    assert again.returncode == 0, again.stderr
    after = await reach(broker, "dlq", "list", "--open", "--json")
    assert after.stdout.strip() == ""


async def test_dlq_picks_a_letter_of_an_id_by_its_time_and_lists_each_with_its_time(broker):
    """Two lives of one id dead-lettered: the table told them apart only by their state, and
    `dlq show` reached only the newest. Each row has its time; --at picks a letter."""
    first = Task(v=1, message_id="twice-1", trace_id="twice-1", topic="t", received_ms=1_000)
    error = ErrorInfo(type="ValueError", message="wrong")
    await letter_of(broker, first, "retries_exhausted", error=error)
    later = msgspec.structs.replace(first, received_ms=200_000)
    await letter_of(broker, later, "retries_exhausted", error=error)
    listed = await reach(broker, "dlq", "list", "--json")
    at = [json.loads(line)["at_ms"] for line in listed.stdout.splitlines()]
    table = await reach(broker, "dlq", "list")
    older = await reach(broker, "dlq", "show", "twice-1", "--at", str(at[0]))
    unknown = await reach(broker, "dlq", "show", "twice-1", "--at", "5")
    misplaced = await reach(broker, "dlq", "list", "--at", "5")
    assert len(at) == 2 and at[0] <= at[1]
    rows = table.stdout.splitlines()
    assert rows[0].split()[:3] == ["MESSAGE_ID", "AT", "REASON"] and len(rows) == 3
    assert older.returncode == 0 and older.stderr == "", older.stderr
    assert json.loads(older.stdout)["envelope"]["received_ms"] == 1_000
    assert unknown.returncode == 1
    assert f"no dead letter of 'twice-1' at 5: its letters are at {at[0]}, {at[1]}" in (
        unknown.stderr
    )
    assert misplaced.returncode == 1 and "--at is for dlq show, replay and resolve" in (
        misplaced.stderr
    )


async def test_a_step_letter_is_not_replayed_as_a_lone_task_unless_forced(broker):
    """`reach dlq replay` of a workflow step's letter ran the step alone, its instance
    taking no part, and said nothing of it (a walkthrough); an undo's letter replays."""
    reply_to = broker.names.workflow_reply("order-7")
    step = Task(v=1, message_id="order-7-charge-1", trace_id="order-7", topic="charge")
    undo = msgspec.structs.replace(step, message_id="order-7-reserve-undo", topic="release")
    for task in (step, undo):
        replied = msgspec.structs.replace(task, reply_to=reply_to)
        await letter_of(
            broker, replied, "retries_exhausted", error=ErrorInfo(type="E", message="m")
        )
    refused = await reach(broker, "dlq", "replay", "order-7-charge-1")
    forced = await reach(broker, "dlq", "replay", "order-7-charge-1", "--force")
    undone = await reach(broker, "dlq", "replay", "order-7-reserve-undo")
    assert refused.returncode == 1
    assert "is step 'charge' of workflow instance 'order-7': a replay runs the step alone" in (
        refused.stderr
    )
    assert forced.returncode == 0, forced.stderr
    assert undone.returncode == 0, undone.stderr


async def test_a_letter_with_no_task_is_replayed_as_its_hint_says(broker):
    """A letter with no decodable task (malformed JSON on a deep subject) asks for the payload
    and `--to-topic`, which replay it; `--topic` selects by the letter's own topic, and a
    search it narrowed to nothing says so rather than only "no dead letter". A replay's
    options given to another action are refused, not ignored."""
    names = broker.names
    letter = DeadLetter(
        v=1,
        reason="invalid_envelope",
        message_id="deep-1",
        trace_id="deep-1",
        topic=envelopes.INVALID_TOPIC,
        error=ErrorInfo(type="invalid_envelope", message="not JSON", retryable=False),
    )
    await broker.publish(
        names.dlq("invalid_envelope", "unknown"), envelopes.encode(letter), headers=LETTERED
    )
    bare = await reach(broker, "dlq", "replay", "deep-1", "--payload", '{"text": "x. y"}')
    assert bare.returncode == 1 and "`--to-topic`" in bare.stderr and "--topic " not in bare.stderr
    narrowed = await reach(broker, "dlq", "replay", "deep-1", "--topic", "summarize")
    assert narrowed.returncode != 0
    assert "no dead letter with message_id 'deep-1' among the letters of --topic summarize" in (
        narrowed.stderr
    )
    assert "--to-topic" in narrowed.stderr
    replayed = await reach(
        broker,
        "dlq",
        "replay",
        "deep-1",
        "--payload",
        '{"text": "x. y"}',
        "--to-topic",
        "summarize",
    )
    assert replayed.returncode == 0, replayed.stderr
    [sent] = await read_stream(broker, names.tasks_stream, names.task("summarize"))
    assert envelopes.decode_task(sent.data).payload == {"text": "x. y"}
    for misplaced in (("--to-topic", "x"), ("--max-replays", "2")):
        shown = await reach(broker, "dlq", "show", "deep-1", *misplaced)
        assert shown.returncode != 0 and f"{misplaced[0]} is for dlq replay" in shown.stderr


async def test_a_replay_keeps_a_long_ttl_of_its_task_or_takes_ttl_ms(broker):
    """A letter's task sent with 15 minutes is replayed with 15 minutes, not the default
    30 s (it expired in intake half a minute later: an outside operator trial); one with
    less gets 30 s; `--ttl-ms` sets it, and is refused out of range or for other actions."""
    names = broker.names
    for message_id, ttl_ms in (("long-lived", 900_000), ("short-lived", 2_000)):
        task = envelopes.Task(
            v=1, message_id=message_id, trace_id=message_id, topic="later", ttl_ms=ttl_ms
        )
        letter = DeadLetter(
            v=1, reason="no_route", message_id=message_id, trace_id=message_id, topic="later"
        )
        letter = msgspec.structs.replace(letter, envelope=task)
        data = envelopes.encode(letter)
        await broker.publish(names.dlq("no_route", "later"), data, headers=LETTERED)
    for argv in (("long-lived",), ("short-lived",), ("long-lived", "--ttl-ms", "5000", "--force")):
        replayed = await reach(broker, "dlq", "replay", *argv)
        assert replayed.returncode == 0, replayed.stderr
    sent = await read_stream(broker, names.tasks_stream, names.task("later"))
    assert [envelopes.decode_task(m.data).ttl_ms for m in sent] == [900_000, 30_000, 5000]
    for argv in (("replay", "short-lived", "--ttl-ms", "0"), ("list", "--ttl-ms", "5000")):
        refused = await reach(broker, "dlq", *argv)
        assert refused.returncode == 1 and "--ttl-ms" in refused.stderr, refused.stderr


async def test_a_letter_after_the_first_ten_thousand_is_found(broker):
    """`reach dlq` read the oldest 10,000 letters only, silently: an outside trial's flood
    left 14,768, and `show` of a newer one said "no dead letter with message_id"."""
    names = broker.names
    subject = names.dlq("rejected", "work")

    def letter(message_id: str) -> bytes:
        error = ErrorInfo(type="rate_limited", message="over its rate", retryable=True)
        return envelopes.encode(
            DeadLetter(
                v=1,
                reason="rejected",
                message_id=message_id,
                trace_id=message_id,
                topic="work",
                error=error,
            )
        )

    for start in range(0, 10_050, 500):
        await asyncio.gather(
            *(
                broker.publish(subject, letter(f"old-{n}"), headers=LETTERED)
                for n in range(start, min(10_050, start + 500))
            )
        )
    await broker.publish(subject, letter("newest-1"), headers=LETTERED)
    shown = await reach(broker, "dlq", "show", "newest-1")
    assert shown.returncode == 0, shown.stderr
    assert "newest-1" in shown.stdout
