"""When a graph step may start, and what a join step is given (pure)."""

from __future__ import annotations

from typing import Any, Literal

from agentreach.coordinator.workflows.spec import Step
from agentreach.envelopes import StepRun

SETTLED: frozenset[str] = frozenset({"completed", "failed", "timed_out", "cancelled"})
Readiness = Literal["ready", "wait", "impossible"]


def readiness(step: Step, steps: dict[str, StepRun]) -> tuple[Readiness, str]:
    """Whether ``step`` may start, given its dependencies' runs (and why not, if never)."""
    after = step.after or []
    if not after:
        return "ready", ""
    runs = [steps.get(name) or StepRun() for name in after]
    done = sum(r.status == "completed" for r in runs)
    missing = sum(r.status == "timed_out" for r in runs)  # timed out with on_timeout partial
    pending = sum(r.status not in SETTLED for r in runs)
    policy = step.join.policy
    if policy == "all":
        return ("ready", "") if done + missing == len(runs) else ("wait", "")
    needed = 1 if policy == "any" else (step.join.quorum or 1)
    if done >= needed:
        return "ready", ""
    if done + pending < needed:
        return "impossible", f"step {step.name!r} needs {needed} of {after}, only {done} done"
    return "wait", ""


def join_value(after: list[str], steps: dict[str, StepRun]) -> dict[str, Any]:
    """What a step after several gets: ``{"results": {…}, "missing": {name: why}}``."""
    results, missing = {}, {}
    for name in after:
        run = steps.get(name) or StepRun()
        if run.status == "completed":
            results[name] = run.output
        else:
            reason = run.error.message if run.error else run.status
            missing[name] = reason if run.status in SETTLED else "not finished when joined"
    return {"results": results, "missing": missing}
