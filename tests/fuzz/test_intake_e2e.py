"""Generated messages through a real nats-server and a running coordinator: each one ends
dispatched to the agent or dead-lettered with a reason that names the path at fault."""

from __future__ import annotations

import asyncio

from tests.fuzz.harness import Ledger, drained
from tests.fuzz.strategies import (
    SEED,
    cases,
    draw_cases,
    explicit_cases,
    trap_cases,
    wire_topics,
)

GENERATED = 300  # on top of the explicit cases
BATCH = 50
BATCH_WAIT_S = 2.0  # a batch that has not settled by then is judged at the end
FINAL_WAIT_S = 8.0


def coordinator_running() -> bool:
    """Whether the coordinator's task (see ``Coordinator.running``) is still alive."""
    tasks = [t for t in asyncio.all_tasks() if t.get_name() == "coordinator"]
    return bool(tasks) and not any(t.done() for t in tasks)


async def test_every_fuzzed_message_is_dispatched_or_dead_lettered_by_path(broker, coordinator):
    """Hundreds of generated messages: each settles, bad ones in REACH_DLQ naming the path."""
    print(f"fuzz seed {SEED}: repeat with FUZZ_SEED={SEED}")
    strategy = cases(topics=wire_topics(), on_wire=True)
    found = explicit_cases(on_wire=True) + draw_cases(strategy, GENERATED, SEED)
    # Last and on their own: when a trap stalls intake, the rest has been judged already.
    traps = range(len(found), len(found) + len(trap_cases()))
    found += trap_cases(on_wire=True)
    batches = [range(i, min(i + BATCH, traps.start)) for i in range(0, traps.start, BATCH)]
    async with Ledger(broker) as ledger, ledger.agent() as agent_connection:
        for batch in [*batches, traps]:
            for no in batch:
                await ledger.publish(no, found[no])
            await ledger.until_settled(batch, BATCH_WAIT_S)
        await ledger.until_settled(range(len(found)), FINAL_WAIT_S)
        backlog = await drained(broker, timeout=3.0)
        running = coordinator_running() and coordinator.broker.nc.is_connected
        agent_connected = agent_connection.nc.is_connected
    account = ledger.account()
    problems = [f"{n} of {kind}" for kind, n in account.counts.items() if n]
    if not running:
        problems.append("the coordinator stopped or lost its connection")
    if not agent_connected:
        problems.append("the fuzz agent lost its connection")
    if any(backlog.values()):
        problems.append(f"REACH_TASKS not drained: {backlog}")
    assert not problems, (
        f"FUZZ_SEED={SEED}\n{account.table()}\n{account.describe_failures()}\n{problems}"
    )
