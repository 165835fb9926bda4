"""The dashboard's "open only" view shows the open letters of the whole stream, not only
those among the last 50, up to a bound, with a count of those it leaves out."""

from __future__ import annotations

from agentreach.agents.letters import resolve
from agentreach.broker import Broker
from agentreach.broker.dead_letters import dead_letter
from agentreach.dashboard import Board, History, sections
from agentreach.dashboard.views import RECENT_LETTERS
from agentreach.envelopes import DeadLetter, Task, encode, now_ms
from tests.support import Watcher, eventually

# What a dead letter carries at least (the coordinator's have their Nats-Msg-Id): one with
# no headers is taken for a direct get's answer asking for none.
LETTERED = {"Reach-Trace-Id": "letter"}


async def test_open_letters_older_than_the_last_50_are_shown(
    broker: Broker, watcher: Watcher, monkeypatch
):
    """Three open letters, then 51 resolved ones: none of the last 50 is open, but the
    snapshot counts 3 open and lists them newest first; with a bound of 2, it lists 2 and
    says 1 is not shown. A letter resolved later leaves the list at the next refresh."""
    ids = [f"old-{n}" for n in range(3)] + [f"new-{n}" for n in range(RECENT_LETTERS + 1)]
    letters = {}
    for message_id in ids:
        task = Task(v=1, message_id=message_id, trace_id=message_id, topic="work")
        letters[message_id] = await dead_letter(
            broker,
            reason="no_route",
            task=task,
            message_id=message_id,
            trace_id=message_id,
            topic="work",
        )
        if message_id.startswith("new-"):
            await resolve(broker, letters[message_id], "done", by="tester")
    await watcher.event("resolved", message_id=ids[-1])
    async with Board(broker, History(step_s=1, window_s=60, period_s=30)) as board:
        shown = board.snapshot()["dead_letters"]
        monkeypatch.setattr(sections, "OPEN_SHOWN", 2)
        bounded = board.snapshot()["dead_letters"]
        await resolve(broker, letters["old-2"], "done too", by="tester")
        await eventually(lambda: "old-2" in board.settling)
        await board.refresh()
        after = board.snapshot()["dead_letters"]
    assert [x["state"] for x in shown["recent"]] == ["resolved"] * RECENT_LETTERS
    assert shown["open"] == 3 and shown["open_not_shown"] == 0
    assert [x["message_id"] for x in shown["open_letters"]] == ["old-2", "old-1", "old-0"]
    assert [x["message_id"] for x in bounded["open_letters"]] == ["old-2", "old-1"]
    assert bounded["open_not_shown"] == 1
    assert after["open"] == 2


async def test_open_letters_never_outnumber_the_letters_kept(broker: Broker):
    """Letters stored since the last refresh are counted open and kept from the same
    refresh: the count of open letters (from their events) never exceeds the total (from
    the stream), which read "284 kept · 286 open" when each came from its own loop."""
    async with Board(broker, History(step_s=1, window_s=60, period_s=30)) as board:
        for n in range(3):
            task = Task(v=1, message_id=f"m-{n}", trace_id=f"m-{n}", topic="work")
            await dead_letter(
                broker,
                reason="no_route",
                task=task,
                message_id=f"m-{n}",
                trace_id=f"m-{n}",
                topic="work",
            )
        await board.refresh()
        shown = board.snapshot()["dead_letters"]
    assert shown["open"] == 3
    assert shown["total"] == 3 == sum(r["count"] for r in shown["by_reason"])


async def test_each_life_of_a_message_id_is_an_open_letter_of_its_own(broker: Broker):
    """An id dead-lettered twice (a later life, or a second ending) is two open letters, as
    `reach dlq list --open` counts them; resolving the first leaves the second open."""
    lives = [
        DeadLetter(v=1, reason="expired", message_id="twice", trace_id="twice", topic="w", at_ms=at)
        for at in (now_ms() - 2_000, now_ms() - 1_000)
    ]
    for letter in lives:
        await broker.publish(broker.names.dlq("expired", "w"), encode(letter), headers=LETTERED)
    async with Board(broker, History(step_s=1, window_s=60, period_s=30)) as board:
        before = board.snapshot()["dead_letters"]["open"]
        await resolve(broker, lives[0], "the first one's, done", by="tester")
        await eventually(lambda: "twice" in board.settling)
        await board.refresh()
        after = board.snapshot()["dead_letters"]["open"]
    assert (before, after) == (2, 1)
