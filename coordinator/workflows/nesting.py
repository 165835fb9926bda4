"""Workflows that run other workflows: a step (or state, fallback or compensation) whose
intent names a workflow starts it as a child instance, whose id is the step's message id.

A set of definitions in which a workflow leads back to itself is refused at start: each
instance would start another, for ever. Definitions the coordinator cannot see together
(replicas configured apart, workflows built in Python and in YAML) may still combine into
such a loop, so each instance also knows how deep it runs below the one a caller started,
from a header of the step task that started it, and one deeper than ``MAX_DEPTH`` fails.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from agentreach.coordinator.config import ConfigError
from agentreach.coordinator.workflows.spec import WorkflowSpec, cycle_in
from agentreach.envelopes import ErrorInfo, Task, WorkflowRecord

MAX_DEPTH = 8  # children below a workflow a caller started
DEPTH_HEADER = "Reach-Workflow-Depth"  # of a step task that starts a child workflow


def runs(spec: WorkflowSpec) -> dict[str, list[str]]:
    """Every intent the workflow may send a task to, with the steps (or states) that do."""
    if spec.states is not None:
        sources = [(name, (s.intent, s.compensate)) for name, s in spec.states.states.items()]
    else:
        sources = [(s.name, (s.intent, s.fallback_intent, s.compensate)) for s in spec.graph()]
    found: dict[str, list[str]] = {}
    for key, intents in sources:
        for intent in intents:
            if intent and key not in found.setdefault(intent, []):
                found[intent].append(key)
    return found


def check_nesting(specs: Mapping[str, WorkflowSpec]) -> None:
    """Refuse definitions in which a workflow runs itself, directly or through others."""
    calls = {name: runs(spec) for name, spec in specs.items()}
    edges = {name: [i for i in sorted(called) if i in specs] for name, called in calls.items()}
    cycle = cycle_in(edges)
    if cycle is None:
        return
    where = ", ".join(
        f"`$.workflows.{caller}` {'state' if specs[caller].is_machine else 'step'}"
        f" {calls[caller][callee][0]!r} runs {callee!r}"
        for caller, callee in itertools.pairwise(cycle)
    )
    raise ConfigError(
        f"a workflow may not run itself, directly or through others: cycle: "
        f"{' → '.join(cycle)} ({where})"
    )


def depth_of(task: Task) -> int:
    """How deep below a workflow a caller started the instance ``task`` starts runs."""
    given = task.headers.get(DEPTH_HEADER, "0")
    return int(given) if given.isdecimal() else 0


def too_deep(record: WorkflowRecord) -> ErrorInfo | None:
    """Why the instance of ``record`` may not run, when it is nested too deep."""
    depth = depth_of(record.task)
    if depth <= MAX_DEPTH:
        return None
    message = (
        f"workflow {record.workflow!r} would run {depth} levels below the one first started,"
        f" more than {MAX_DEPTH}: do workflows run each other in a loop?"
    )
    return ErrorInfo(type="too_deep", message=message, retryable=False)


def child_headers(parent: Task) -> dict[str, str]:
    """The headers of a step task that starts a child of the instance ``parent`` started."""
    return {DEPTH_HEADER: str(depth_of(parent) + 1)}
