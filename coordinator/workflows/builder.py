"""Building workflow definitions in Python, the same structures the YAML gives.

from agentreach.coordinator import workflow as wf

article = wf.chain(wf.step("plan", "plan"), wf.step("write", "write"))
order = wf.machine("pending", {
    "pending": wf.state("charge", next=[wf.go("paid", when=("paid", "==", True))]),
    "paid": wf.state("ship", terminal=True),
})
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentreach.coordinator.workflows.spec import (
    FanOut,
    Join,
    Machine,
    State,
    Step,
    Transition,
    When,
    WorkflowSpec,
)


def step(name: str, intent: str | None = None, **options: Any) -> Step:
    return msgspec.convert({"name": name, "intent": intent, **options}, Step)


def chain(*steps_: Step, **options: Any) -> WorkflowSpec:
    return WorkflowSpec(chain=list(steps_), **options)


def fanout(
    branches: list[Step], *, join: Join | None = None, then: Step | None = None, **options: Any
) -> WorkflowSpec:
    return WorkflowSpec(fanout=FanOut(branches=branches, join=join or Join(), then=then), **options)


def steps(*graph: Step, **options: Any) -> WorkflowSpec:
    return WorkflowSpec(steps=list(graph), **options)


def machine(initial: str, states: dict[str, State], **options: Any) -> WorkflowSpec:
    return WorkflowSpec(states=Machine(initial=initial, states=states), **options)


def state(intent: str | None = None, **options: Any) -> State:
    return msgspec.convert({"intent": intent, **options}, State)


def go(
    to: str, *, when: tuple[str, str, Any] | None = None, event: str | None = None
) -> Transition:
    """A transition: ``go("paid", when=("paid", "==", True))``, ``go("x", event="cancel")``."""
    condition = None
    if when is not None:
        condition = msgspec.convert(dict(zip(("field", "op", "value"), when, strict=True)), When)
    return Transition(to=to, when=condition, event=event)
