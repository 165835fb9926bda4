"""What a signal no state of its instance waits for comes to: an event its sender can read."""

from __future__ import annotations

from agentreach.broker import Broker
from agentreach.broker.lifecycle import emit, event_for
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import WorkflowRecord


async def signal_ignored(
    broker: Broker,
    record: WorkflowRecord,
    spec: WorkflowSpec | None,
    event: str,
    asker: str | None,
) -> None:
    """Record ``signal_ignored`` about ``record``'s instance: the signal, who sent it, and
    the events its current state would take (a typo shows)."""
    ignored: dict[str, object] = {"signal": event, "workflow": record.workflow}
    if asker is not None:
        ignored["by"] = asker
    if (waits := events_awaited(record, spec)) is not None:
        ignored["waits_for"] = waits
    await emit(broker, event_for(record.task, "signal_ignored", **ignored))


def events_awaited(record: WorkflowRecord, spec: WorkflowSpec | None) -> list[str] | None:
    """The events the instance's current state takes (None: not a machine in a state)."""
    if spec is None or spec.states is None or record.current is None:
        return None
    state = spec.states.states.get(record.current)
    return [t.event for t in state.next if t.event] if state is not None else None
