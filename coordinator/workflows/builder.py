"""Building workflow definitions in Python, the same structures the YAML gives.

from agentreach.coordinator import workflow as wf

article = wf.chain(wf.step("plan", "plan"), wf.step("write", "write"))
order = wf.machine("pending", {
    "pending": wf.state("charge", next=[wf.go("paid", when=("paid", "==", True))]),
    "paid": wf.state("ship", terminal=True),
})
"""

from __future__ import annotations

from typing import Any, TypeVar

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
    meant,
)

Part = TypeVar("Part", bound=msgspec.Struct)


def step(name: str, intent: str | None = None, **options: Any) -> Step:
    """One step: a task for ``intent`` (without one, its input is passed on as its output).

    ``name``: 1-40 letters, digits or '_', unique in the workflow, not ``input``, ``prev``,
    ``results`` or ``missing``. ``options`` are the YAML step's keys: ``input`` (a template,
    ``{"outline": "$.plan.outline"}``; default: the previous output, the join, or the
    workflow's input), ``after`` (more dependencies), ``join`` (a :class:`Join`),
    ``timeout_s`` (the step's own budget; default: the starting task's execute budget),
    ``on_timeout`` (``"fail"``, ``"partial"`` or ``"fallback"`` with ``fallback_intent``),
    ``compensate`` (the intent that undoes it) and ``priority`` (default: the starting
    task's). A wrong key or value raises ``msgspec.ValidationError`` (a ``ValueError``).

        step("web", "search_web", timeout_s=5, on_timeout="partial")
    """
    return _built(f"step {name!r}", {"name": name, "intent": intent, **options}, Step)


def chain(*steps_: Step, **options: Any) -> WorkflowSpec:
    """A workflow of ``steps_`` in order: each step's result is the next one's payload (or is
    mapped by its ``input``); the last one's is the workflow's result.

    ``options`` are the workflow's: ``on_failure`` (``"fail"``, or ``"compensate"``: undo
    the completed steps in reverse order with their ``compensate`` intents) and ``ttl_s``
    (300: the longest an instance runs, also capped by its starting task's ttl). A wrong
    definition raises ``ValueError``; an unknown option, ``TypeError``.

        chain(step("plan", "plan"), step("publish", "publish", compensate="unpublish"),
              on_failure="compensate")
    """
    return _checked(WorkflowSpec(chain=_steps("chain", steps_), **options))


def fanout(
    branches: list[Step], *, join: Join | None = None, then: Step | None = None, **options: Any
) -> WorkflowSpec:
    """A workflow that runs ``branches`` (two or more) in parallel, then ``then``.

    ``join`` says when ``then`` starts: ``Join()`` (all branches, the default),
    ``Join(policy="any")`` or ``Join(policy="quorum", quorum=N)``; it does not wait for the
    others. ``then`` gets ``{"results": {branch: output}, "missing": {branch: reason}}``;
    without it, that is the workflow's result. ``options`` are :func:`chain`'s.

        fanout([step("web", "search_web", timeout_s=5, on_timeout="partial"),
                step("papers", "search_papers")],
               join=Join(policy="quorum", quorum=1), then=step("merge", "merge"))
    """
    if then is not None:
        _steps("fanout's then", [then])
    fan_out = FanOut(branches=_steps("fanout", branches), join=join or Join(), then=then)
    return _checked(WorkflowSpec(fanout=fan_out, **options))


def steps(*graph: Step, **options: Any) -> WorkflowSpec:
    """A workflow as a graph: each step names the steps it waits for in ``after``. The last
    step listed is the result, and every other step must lead to it; a step whose intent is
    another workflow runs it as a child. ``options`` are :func:`chain`'s.

        steps(step("a", "fetch"), step("b", "parse", after=["a"]), step("c", "store", after=["b"]))
    """
    return _checked(WorkflowSpec(steps=_steps("steps", graph), **options))


def machine(initial: str, states: dict[str, State], **options: Any) -> WorkflowSpec:
    """A state machine: ``states`` maps names to :func:`state`, starting at ``initial``; at
    least one state is terminal. ``options`` are :func:`chain`'s.

        machine("pending", {
            "pending": state("charge", next=[go("paid", when=("paid", "==", True))]),
            "paid": state("ship", terminal=True),
        })
    """
    for name, given in states.items():
        if not isinstance(given, State):
            made = (
                "wf.step(...), a step of a chain, fan-out or graph"
                if isinstance(given, Step)
                else type(given).__name__
            )
            raise TypeError(f"machine: state {name!r} is {made}; a state is wf.state(intent, ...)")
    return _checked(WorkflowSpec(states=Machine(initial=initial, states=states), **options))


def _checked(spec: WorkflowSpec) -> WorkflowSpec:
    """``spec`` as the YAML would give it: a Struct's constructor checks no value, so a
    misspelt ``on_failure="undo"`` was served (and undid nothing), ``ttl_s="soon"`` crashed
    every start. Raises ``msgspec.ValidationError`` (a ``ValueError``) naming the path."""
    return msgspec.convert(msgspec.to_builtins(spec), WorkflowSpec)


def state(intent: str | None = None, **options: Any) -> State:
    """One state of a :func:`machine`: a task for ``intent`` (without one, it only waits for
    an event), then the first of ``next`` (a list of :func:`go`) that holds.

    ``options``: ``next``, ``terminal`` (no ``next`` then), ``input`` (a template; default:
    the previous state's output), ``timeout_s`` (the intent's run) and ``wait_s`` (the wait
    for an event) with ``on_timeout`` (a state to go to past either),
    ``on_error`` (a state to go to when the task fails for good), ``compensate`` and
    ``priority``. A wrong key or value raises ``msgspec.ValidationError`` (a ``ValueError``).
    """
    return _built(f"state of intent {intent!r}", {"intent": intent, **options}, State)


def go(
    to: str, *, when: tuple[str, str, Any] | None = None, event: str | None = None
) -> Transition:
    """A transition to state ``to``: on the result (``go("paid", when=("paid", "==", True))``:
    field, operator, value), on an event (``go("refunded", event="cancel")``, sent by
    ``reach workflows signal ID cancel``), or with neither, always (put it last)."""
    condition = None
    if when is not None:
        if not isinstance(when, tuple | list) or len(when) != 3:
            raise ValueError(f"go({to!r}): when={when!r} is (field, operator, value)")
        condition = _built(
            f"go({to!r})'s when", dict(zip(("field", "op", "value"), when, strict=True)), When
        )
    return Transition(to=to, when=condition, event=event)


def _built(what: str, fields: dict[str, Any], kind: type[Part]) -> Part:
    """``fields`` as a ``kind``; a wrong key or value raises ``msgspec.ValidationError``
    naming ``what`` and, for an unknown key, the one it may have meant."""
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise msgspec.ValidationError(f"{what}: {meant(str(exc))}") from None


def _steps(where: str, given: Any) -> list[Step]:
    """``given`` as a list of steps; TypeError naming the first that is none."""
    for n, part in enumerate(given, start=1):
        if not isinstance(part, Step):
            made = "wf.state(...), a state machine's" if isinstance(part, State) else repr(part)
            raise TypeError(f"{where}: step {n} is {made}; a step is wf.step(name, intent, ...)")
    return list(given)
