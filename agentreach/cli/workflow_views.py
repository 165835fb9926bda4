"""How ``reach workflows`` shows instances: a table of them, and the tree of one's steps."""

from __future__ import annotations

import datetime as dt

import msgspec

from agentreach.cli.terminal import one_line
from agentreach.envelopes import StepRun, WorkflowRecord


def table(records: list[WorkflowRecord]) -> str:
    if not records:
        return "no workflow instances"
    header = f"{'INSTANCE':<40} {'WORKFLOW':<16} {'STATUS':<13} {'STARTED':<9} {'DONE':>5}  NOW"
    # DONE: steps completed of the workflow's steps (a state machine: of the states entered)
    lines = [header]
    for r in records:
        done = sum(s.status == "completed" for s in r.steps.values())
        # 0: a machine (how many states it will enter is not known), or an older record
        total = r.steps_total or ("-" if r.status == "running" else len(r.steps))
        running = [k for k, s in r.steps.items() if s.status == "running"]
        # A wide fan-out runs hundreds at once: a line of a screen, not of 2,000 characters.
        now = r.current or ", ".join(running[:3]) + (f" +{len(running) - 3}" * (len(running) > 3))
        started = clock(r.started_ms)
        lines.append(
            f"{r.instance_id:<40} {r.workflow:<16} {r.status:<13} {started:<9}"
            f" {done:>2}/{total:<2}  {now or '-'}"
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
    steps = list(record.replaced.items()) + list(record.steps.items())
    undo = [(f"undo {key}", run) for key, run in record.compensations.items()]
    for i, (key, run) in enumerate(steps + undo):
        branch = "└─" if i == len(steps) + len(undo) - 1 else "├─"
        # The state a running machine stays in once its work is done waits for a signal.
        waits = key == record.current and record.status == "running" and run.status == "completed"
        # The state it ended in (cancelled, expired) waited until then: it completed nothing.
        cut = key == record.current and record.status in ("failed", "cancelled")
        if cut and not run.intent and run.status == "completed":
            run = msgspec.structs.replace(run, status="cancelled")
        left_ms = record.ended_ms if cut and not run.intent else _left_ms(record, key)
        line = _step(key, run, record.started_ms, waits=waits, left_ms=left_ms)
        if key in record.awaiting:  # stopped while it ran: it still runs, its outcome awaited
            line += "  ← stopped while it ran: its outcome is awaited, then undone"
        elif run.status == "cancelled" and run.error is None:  # it said no reason at all
            line += f"  ← {_why_stopped(record)}"
        lines.append(f"  {branch} {line}")
    if record.error is not None:
        lines.append(f"  error: {record.error.type}: {record.error.message}")
    if record.awaiting:  # stopped while they ran: one done after all is undone first
        lines.append(f"  undoing waits first for the outcome of {', '.join(record.awaiting)}")
    return "\n".join(map(one_line, lines))  # a step's error starts no line of its own


def _why_stopped(record: WorkflowRecord) -> str:
    """Why a step without an error of its own was stopped: the instance ended, or went on."""
    if record.error is not None:
        return f"stopped as the instance ended: {record.error.type}"
    if record.status == "completed" and record.path:
        return "stopped: a signal moved the machine on without it"
    if record.status == "completed":
        return "stopped: the instance completed without it (its join needed no more)"
    return "stopped: the instance no longer waits for it"


def _left_ms(record: WorkflowRecord, key: str) -> int:
    """When a state machine left its last visit of state ``key`` (entered the next), or 0."""
    if key not in record.path:
        return 0
    after = len(record.path) - record.path[::-1].index(key)
    entered = record.steps.get(record.path[after]) if after < len(record.path) else None
    return entered.started_ms if entered is not None else 0


def _step(key: str, run: StepRun, start_ms: int, *, waits: bool = False, left_ms: int = 0) -> str:
    offset = f"+{run.started_ms - start_ms}ms" if run.started_ms else ""
    # A state without an intent ends as it is entered; one left later waited for an event.
    waited = not run.intent and left_ms > run.ended_ms
    ended_ms = left_ms if waited else run.ended_ms
    took = f"{ended_ms - run.started_ms} ms" if ended_ms and run.started_ms else ""
    visit = f" (visit {run.visit})" if run.visit > 1 else ""
    # A state without an intent that waits has done nothing: it waits, it did not complete.
    status = "waiting" if waits and not run.intent else run.status
    what = run.intent or ("(waits for an event)" if waits else "(pass-through)")
    # Stopped while it waited (the instance ended: cancelled, expired), it passed nothing on.
    waited = waited or (not run.intent and not waits and run.status in ("cancelled", "timed_out"))
    what = "(waited for an event)" if waited else what
    if run.error is not None and run.error.type == "input_missing":
        what = "(not started)"  # its input named nothing: no task was sent
    line = f"{key:<14} {status:<10} {offset:>9} {took:>8}  {what}"
    line += f"{visit}  {run.message_id}"
    if waits:
        until = f" until {clock(run.deadline_ms)}" if run.deadline_ms else ""
        line += f"  ← waits here for a signal{until} (reach workflows signal ID EVENT)"
    if run.error is not None:
        line += f"  {run.error.type}: {run.error.message}"
    return line.rstrip()


def clock(ms: int) -> str:
    """``HH:MM:SS`` local time of ``ms`` (epoch ms); ``-`` for 0."""
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S") if ms else "-"
