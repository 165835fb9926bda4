"""`reach agents`: what it says about intents a coordinator refuses."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from agentreach.broker import provision
from agentreach.cli import status
from agentreach.cli.agent_rows import breaker_shown, collect
from agentreach.cli.status import coordinators
from agentreach.coordinator.routing import allowances
from agentreach.envelopes import BreakerRecord
from tests.cli.conftest import reach_argv, run
from tests.cli.test_reach_cli import worker
from tests.support import wait_for_card


async def test_no_refusals_are_shown_where_no_coordinator_enforces_allowances(broker, coordinator):
    """Allowances in KV, but a coordinator without its seal key routes every intent a card
    names: `reach agents` must not say REFUSED (it did whenever the bucket existed)."""
    await provision(broker, allowances.topology(broker.names))
    bucket = await broker.bucket(allowances.bucket_name(broker.names), allowances.Allowance)
    await bucket.put("cli-reach-worker", allowances.Allowance(agent_id="cli-reach-worker"))
    async with worker().running(broker=broker):
        await wait_for_card(broker, "cli-reach-worker", status="running")
        [status] = await coordinators(broker)
        assert status["enforces_allowances"] is False
        shown = await run(*reach_argv(broker, "agents"))
    assert shown.returncode == 0, shown.stderr
    assert "cli-reach-worker" in shown.stdout
    assert "REFUSED" not in shown.stdout


async def test_priorities_in_the_allowances_bucket_are_not_read_as_allowances(broker, coordinator):
    """`reach auth push` writes ``priorities.<name>`` beside the agents' allowances:
    `reach agents` reads only the allowances, warning of nothing (it warned once per party)."""
    await provision(broker, allowances.topology(broker.names))
    name = allowances.bucket_name(broker.names)
    intents = await broker.bucket(name, allowances.Allowance)
    await intents.put("cli-reach-worker", allowances.Allowance(agent_id="cli-reach-worker"))
    senders = await broker.bucket(name, allowances.SenderPriorities)
    await senders.put(
        allowances.priorities_key("billing"),
        allowances.SenderPriorities(sender="billing", priorities=("P1",)),
    )
    async with worker().running(broker=broker):
        await wait_for_card(broker, "cli-reach-worker", status="running")
        with capture_logs() as logs:
            [row] = await collect(broker, allowances_enforced=True)
    assert [log for log in logs if log["log_level"] == "warning"] == []
    assert row.refused  # its allowance (none) was read: every intent it serves is refused


def test_an_open_breaker_past_its_open_time_says_its_next_call_is_a_trial():
    """A breaker stays open until a call comes to be its trial: long past its 10 s it read
    as stuck open (a walkthrough). It says the trial is due."""
    breaker = BreakerRecord(agent_id="a-1", intent="fetch", state="open", open_until_ms=10_000)
    isolation = BreakerRecord(agent_id="a-1", state="half_open", open_until_ms=10_000)
    assert breaker_shown(breaker, 9_999) == "fetch:open"
    assert breaker_shown(breaker, 10_000) == "fetch:open(trial due)"
    assert breaker_shown(isolation, 20_000) == "ISOLATED:half_open"


async def test_a_busy_coordinator_is_not_taken_for_none(broker):
    """`reach publish --wait` said no coordinator runs while one did, on a busy host: its
    status answer took over the 0.3 s the CLI waited. The first answer may take 3 s; with
    nobody listening the server says so, and nothing is waited for."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await coordinators(broker) == []
    nobody_s = loop.time() - started

    async def slow(msg) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(1.0)
        await msg.respond(b'{"replica": "slow-1"}')

    sub = await broker.nc.subscribe(broker.names.status, cb=slow)
    try:
        found = await coordinators(broker)
    finally:
        await sub.unsubscribe()
    assert [status["replica"] for status in found] == ["slow-1"]
    assert nobody_s < 2.5  # told at once, not after the 3 s a first answer may take


async def test_none_answering_is_believed_only_when_it_lasts(broker, monkeypatch):
    """Just after a server restart `reach publish --wait` said no coordinator ran, while one
    was reconnecting and answered a second later (an outside trial). With ``none_for_s`` a
    coordinator that begins answering meanwhile is found."""
    asked = asyncio.Event()
    real = status.gather_replies

    async def observed(*args, **kwargs):  # type: ignore[no-untyped-def]
        answers = await real(*args, **kwargs)
        asked.set()
        return answers

    monkeypatch.setattr(status, "gather_replies", observed)
    finding = asyncio.create_task(coordinators(broker, none_for_s=3))
    await asyncio.wait_for(asked.wait(), 5)  # nobody listened at the first ask

    async def answer(msg) -> None:  # type: ignore[no-untyped-def]
        await msg.respond(b'{"replica": "late-1"}')

    sub = await broker.nc.subscribe(broker.names.status, cb=answer)
    try:
        found = await asyncio.wait_for(finding, 10)
    finally:
        await sub.unsubscribe()
    assert [s["replica"] for s in found] == ["late-1"]
