"""Workflow instances in a chaos run: two-step chains started beside the tasks, each step a
task of the recording agents. Every instance must end (completed, or failed for a reason
said), and every step the instance sent must run to its end once, as a task must.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agentreach.broker import Broker, BrokerError
from agentreach.envelopes import DeadLetter, WorkflowRecord
from tests.chaos.accounting import Accounting, Kill, Outage, account
from tests.chaos.recorder import TOPIC, Record

FLOW = "chaos_flow"
FLOW_CONFIG = f"""\
workflows:
  {FLOW}:
    chain:
      - {{name: one, intent: {TOPIC}}}
      - {{name: two, intent: {TOPIC}}}
"""
SHOWN = 8  # instances described per problem in a report


@dataclass
class FlowAccounting:
    """How the instances ended, and the accounting of the steps they sent."""

    sent: int
    steps: Accounting
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # by the error's type
    unended: list[str] = field(default_factory=list)  # "<id>: <status>, steps …"

    def rows(self) -> list[tuple[str, int]]:
        failed = [(f"failed: {kind}", n) for kind, n in sorted(self.failed.items())]
        return [
            ("workflows started", self.sent),
            ("completed", self.completed),
            *failed,
            ("not ended", len(self.unended)),
            ("steps sent", self.steps.sent),
        ] + [(f"steps {label}", n) for label, n in self.steps.rows()[1:]]

    def table(self) -> str:
        width = max(len(label) for label, _ in self.rows())
        return "\n".join(f"  {label:<{width}}  {n:>7,}" for label, n in self.rows())

    def problems(self) -> list[str]:
        steps = self.steps
        found = []
        if self.unended:
            found.append(f"{len(self.unended)} workflows not ended:")
            found.append("\n".join(f"    {line}" for line in self.unended[:SHOWN]))
        for ids, said in (
            (steps.lost, "workflow steps lost"),
            (steps.duplicated_other, "workflow steps ran twice on agents not killed mid-task"),
            (steps.completed_and_dlq_other, "workflow steps completed and also dead-lettered"),
        ):
            if ids:
                found += [f"{len(ids)} {said}:", steps.examples(ids)]
        return found


async def flow_records(broker: Broker, ids: Iterable[str]) -> dict[str, WorkflowRecord] | None:
    """The records of the instances ``ids`` that exist; None while the server cannot say."""
    try:
        bucket = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
        entries = await bucket.snapshot()
    except BrokerError:
        return None
    return {key: entries[key].value for key in ids if key in entries}


async def unended(broker: Broker, ids: Sequence[str]) -> int | None:
    """How many of the instances ``ids`` have not ended; None while the server cannot say."""
    if not ids:
        return 0
    records = await flow_records(broker, ids)
    if records is None:
        return None
    return sum(1 for key in ids if key not in records or not records[key].finished)


def account_flows(
    sent: Sequence[str],
    records: dict[str, WorkflowRecord],
    agent_records: Iterable[Record],
    letters: Iterable[DeadLetter],
    kills: list[Kill],
    outages: Sequence[Outage] = (),
    away: Mapping[int, Sequence[Outage]] | None = None,
) -> FlowAccounting:
    """Each instance of ``sent`` by how it ended; its sent steps as tasks are accounted."""
    step_ids = [
        run.message_id
        for key in sent
        if key in records
        for run in records[key].steps.values()
        if run.sent
    ]
    steps = account(step_ids, agent_records, letters, kills, outages, away)
    result = FlowAccounting(sent=len(sent), steps=steps)
    for key in sent:
        record = records.get(key)
        if record is None or not record.finished:
            said = "no record" if record is None else _progress(record)
            result.unended.append(f"{key}: {said}")
        elif record.status == "completed":
            result.completed += 1
        else:
            result.failed[record.error.type if record.error else record.status] += 1
    return result


def _progress(record: WorkflowRecord) -> str:
    steps = ", ".join(f"{name} {run.status}" for name, run in record.steps.items())
    return f"{record.status}; steps: {steps or 'none'}"
