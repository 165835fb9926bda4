"""The dashboard's views of a running system, read from NATS."""

from __future__ import annotations

import asyncio

from agentreach.broker import Broker
from agentreach.broker.lifecycle import emit, event_for
from agentreach.dashboard import Board, History
from agentreach.envelopes import Task, new_id, now_ms


def _task(received_ms: int) -> Task:
    message_id = new_id()
    return Task(
        v=1, message_id=message_id, trace_id=message_id, topic="echo", received_ms=received_ms
    )


async def test_a_report_counts_only_of_an_attempt_routed_to_its_sender(broker: Broker, coordinator):
    """A `completed` an agent sent of a message never routed (an outside trial's ghosts)
    made the page say 413 completions of 414 with 409 dispatches: the fold counts an
    agent's report only when a routing vouches for it, as the metrics do."""
    real, ghost = _task(now_ms()), _task(1000)
    await emit(broker, event_for(real, "routed", agent_id="echo-1"))
    for task, agent in ((ghost, "mallory"), (real, "echo-1")):
        report = event_for(task, "completed", agent_id=agent, duration_ms=1)
        await emit(broker, report, sender=agent)
    async with Board(broker, History(step_s=1, window_s=60, period_s=30)) as board:
        await asyncio.wait_for(board.history_read.wait(), 10)
        values = board.history.values(now_ms())
    assert values["completed"] == 1
    assert values["p99_latency"] is not None and values["p99_latency"] < 60
