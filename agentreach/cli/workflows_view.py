"""``reach workflows`` and the workflow part of ``reach trace``: instances as tables and trees."""

from __future__ import annotations

import datetime as dt

from agentreach.broker import Broker
from agentreach.broker.reader import read_bucket
from agentreach.coordinator.workflow_run import StepRun, WorkflowRecord


async def all_records(broker: Broker) -> list[WorkflowRecord]:
    """Every instance in ``reach_workflows``, newest first."""
    kv = await broker.kv(broker.names.workflows_bucket)
    stored = await read_bucket(kv, WorkflowRecord)
    return sorted((s.value for s in stored.values()), key=lambda r: r.started_ms, reverse=True)


def table(records: list[WorkflowRecord]) -> str:
    if not records:
        return "no workflow instances"
    header = f"{'INSTANCE':<40} {'WORKFLOW':<16} {'STATUS':<13} {'STARTED':<9} {'DONE':>5}  NOW"
    lines = [header]  # DONE: completed of the steps started so far
    for r in records:
        done = sum(s.status == "completed" for s in r.steps.values())
        now = r.current or ", ".join(k for k, s in r.steps.items() if s.status == "running")
        started = _clock(r.started_ms)
        lines.append(
            f"{r.instance_id:<40} {r.workflow:<16} {r.status:<13} {started:<9}"
            f" {done:>2}/{len(r.steps):<2}  {now or '-'}"
        )
    return "\n".join(lines)


def tree(record: WorkflowRecord) -> str:
    """The instance, then one line per step (and compensation) with its state and timing."""
    took = f", {record.ended_ms - record.started_ms} ms" if record.ended_ms else ""
    lines = [
        f"workflow {record.workflow} {record.instance_id} · {record.status}{took}"
        f" · trace {record.trace_id}"
    ]
    if record.path:
        lines.append(f"  path: {' → '.join(record.path)}")
    steps = list(record.steps.items())
    undo = [(f"undo {key}", run) for key, run in record.compensations.items()]
    for i, (key, run) in enumerate(steps + undo):
        branch = "└─" if i == len(steps) + len(undo) - 1 else "├─"
        lines.append(f"  {branch} {_step(key, run, record.started_ms)}")
    if record.error is not None:
        lines.append(f"  error: {record.error.type}: {record.error.message}")
    return "\n".join(lines)


def _step(key: str, run: StepRun, start_ms: int) -> str:
    offset = f"+{run.started_ms - start_ms}ms" if run.started_ms else ""
    took = f"{run.ended_ms - run.started_ms} ms" if run.ended_ms and run.started_ms else ""
    visit = f" (visit {run.visit})" if run.visit > 1 else ""
    line = f"{key:<14} {run.status:<10} {offset:>9} {took:>8}  {run.intent or '(pass-through)'}"
    line += f"{visit}  {run.message_id}"
    if run.error is not None:
        line += f"  {run.error.type}: {run.error.message}"
    return line.rstrip()


def _clock(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S") if ms else "-"
