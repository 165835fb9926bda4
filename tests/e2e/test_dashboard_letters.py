"""The dashboard's dead letters panel shows each letter's state as `reach dlq list` does,
and can show only the open ones."""

from __future__ import annotations

import asyncio

from agentreach.agents.letters import replay, resolve
from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import Board, DashboardApp, History
from agentreach.envelopes import DeadLetter, ErrorInfo, Task, WorkflowStep, encode
from tests.cli.conftest import reach_argv, run
from tests.dashboard.token import TOKEN, login_url
from tests.e2e.browser import Browser
from tests.e2e.test_dashboard import _browser

STATES = {"dash-open": "open", "dash-replayed": "replayed", "dash-resolved": "resolved"}
STATES |= {"dash-handled": "handled"}


async def _letters(broker) -> None:  # type: ignore[no-untyped-def]
    """One dead letter in each state: left open, replayed, resolved, handled by its workflow."""
    for message_id in STATES:
        handled = message_id == "dash-handled"
        letter = DeadLetter(
            v=1,
            reason="expired",
            message_id=message_id,
            trace_id=message_id,
            topic="chores",
            envelope=Task(v=1, message_id=message_id, trace_id=message_id, topic="chores"),
            error=ErrorInfo(type="expired", message="ttl passed", retryable=False),
            workflow=WorkflowStep(instance_id="w-1", step="a", handled=True) if handled else None,
        )
        subject = broker.names.dlq("expired", "chores")
        await broker.publish(subject, encode(letter), headers={"Nats-Msg-Id": f"dlq-{message_id}"})
        if message_id == "dash-replayed":
            await replay(broker, letter)
        elif message_id == "dash-resolved":
            await resolve(broker, letter, "done by hand", by="tester")


async def test_the_letters_panel_shows_each_state_as_dlq_list_does_and_only_open_ones(
    broker, watcher
):
    """Open, replayed, resolved and handled letters show those states in the snapshot and
    on the page, the same as `reach dlq list`'s STATE column; ticking "open only" leaves
    just the open one."""
    executable = _browser()
    await _letters(broker)
    await watcher.event("resolved", message_id="dash-resolved")
    listed = await run(*reach_argv(broker, "dlq", "list"))
    in_list = {row.split()[0]: row.split()[4] for row in listed.stdout.splitlines()[1:]}
    history = History(step_s=1, window_s=120, period_s=30)
    async with (
        Board(broker, history, version="test") as board,
        HttpServer(DashboardApp(board, token=TOKEN, tick_s=0.25)) as server,  # type: ignore[arg-type]
    ):
        await board.history_read.wait()  # the replayed and resolved events are folded

        def look() -> tuple[dict, dict]:
            with Browser(executable, 1400, 1000) as browser:
                session = browser.open(login_url(server))
                every = browser.wait_for(session, lambda f: len(f.get("letterStates", {})) == 4)
                browser.evaluate(session, 'document.getElementById("dlq-open-only").click()')
                only = browser.wait_for(session, lambda f: len(f.get("letterStates", {})) == 1)
                return every, only

        every, only = await asyncio.to_thread(look)
        recent = board.snapshot()["dead_letters"]
    assert in_list == STATES
    assert {letter["message_id"]: letter["state"] for letter in recent["recent"]} == STATES
    assert recent["open"] == 1
    assert every["letterStates"] == STATES
    assert only["letterStates"] == {"dash-open": "open"}
