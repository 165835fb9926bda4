"""A dead letter's ``dead_lettered`` event comes before anything a worker does with it."""

from __future__ import annotations

import asyncio

from agentreach.agents import Compensation, CompensationWorker
from agentreach.broker import Broker
from agentreach.broker.dead_letters import dead_letter
from agentreach.cli.trace import collect
from agentreach.envelopes import DeadLetter


async def test_a_letter_resolved_at_once_is_traced_after_its_dead_lettered_event(
    broker, watcher, monkeypatch
):
    """A worker that resolves a letter the moment it sees it: the trace (the event stream's
    order) says dead_lettered, then resolved. The letter was published before its event, so
    a quick worker's ``resolved`` was stored first (4 times of 4 in a user's trace); a
    dead-lettering coordinator slow between the two publishes makes that certain here."""
    publish = broker.publish

    async def slow_events(subject, data, **kwargs):  # type: ignore[no-untyped-def]
        if subject.startswith(f"{broker.names.prefix}.event.dead_lettered."):
            await asyncio.sleep(0.3)  # a busy coordinator, or a publish tried again
        return await publish(subject, data, **kwargs)

    async def resolve(letter: DeadLetter, comp: Compensation) -> None:
        await comp.resolve(letter, "refunded by hand")

    worker = CompensationWorker("order", resolve, reasons=["expired"])
    async with (
        Broker(broker.url, names=broker.names, name="worker") as own,
        worker.running(broker=own),
    ):
        monkeypatch.setattr(broker, "publish", slow_events)
        await dead_letter(
            broker, reason="expired", message_id="late-1", trace_id="late-1", topic="refund"
        )
        await watcher.event("resolved", message_id="late-1")
    kinds = [step.event.event for step in await collect(broker, "late-1")]
    assert kinds == ["dead_lettered", "resolved"]
