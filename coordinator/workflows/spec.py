"""Workflow definitions: chain, fan-out / fan-in and state machines, from YAML or Python.

    workflows:
      article:                      # started by a task on reach.task.article
        on_failure: compensate      # saga: undo completed steps in reverse order
        chain:
          - {name: plan, intent: plan}
          - {name: write, intent: write, input: {outline: "$.plan.outline", topic: "$.input.topic"}}
          - {name: publish, intent: publish, compensate: unpublish}
      research:
        fanout:
          branches:
            - {name: web, intent: search_web, timeout_s: 2, on_timeout: partial}
            - {name: papers, intent: search_papers}
          join: {policy: quorum, quorum: 1}
          then: {name: merge, intent: merge}     # gets {"results": {...}, "missing": {...}}
      order:
        states:
          initial: pending
          states:
            pending: {intent: charge, next: [{when: {field: paid, value: true}, to: paid},
                                             {to: refunded}]}
            paid: {intent: ship, next: [{to: done}]}
            done: {terminal: true}
            refunded: {intent: refund, terminal: true}

The same structures are built in Python with ``chain``, ``fanout``, ``steps`` and
``machine`` from :mod:`agentreach.coordinator.workflows.builder`. Chains and fan-outs become
one graph of steps (:meth:`WorkflowSpec.graph`); a step's ``intent`` may name another workflow
(one that never leads back to it: :mod:`.nesting`).
Inputs are templates: a string ``"$.a.b"`` is the value at that path of
``{"input": <the workflow's payload>, <step>: <its output>, ...}``.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal

import msgspec

from agentreach.coordinator.conditions import Comparison, lookup
from agentreach.coordinator.workflows.precedence import (
    RESERVED,
    check_graph_paths,
    check_machine_ends,
    check_machine_paths,
    machine_warnings,
)
from agentreach.coordinator.workflows.templates import check_template
from agentreach.envelopes import MAX_TTL_MS, Priority
from agentreach.envelopes.messages import Token

StepName = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z0-9_]{1,40}$", description="letters, digits, '_'")
]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
Policy = Literal["all", "any", "quorum"]
OnTimeout = Literal["fail", "partial", "fallback"]
FORMS = ("chain", "fanout", "steps", "states")
MAX_STATE_VISITS = 100

# Defaults are left out when a definition is written (an instance record keeps its own).
_Strict = {"frozen": True, "kw_only": True, "forbid_unknown_fields": True, "omit_defaults": True}


class Join(msgspec.Struct, **_Strict):  # type: ignore[misc]
    """When a step with several dependencies may start: all, any, or a quorum of them done."""

    policy: Policy = "all"
    quorum: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def __post_init__(self) -> None:
        if (self.policy == "quorum") != (self.quorum is not None):
            raise ValueError("'quorum: N' goes with `policy: quorum`, and only with it")


class Step(msgspec.Struct, **_Strict):  # type: ignore[misc]
    """One unit of work: a task for ``intent`` (or, without one, its input passed on)."""

    name: StepName
    intent: Token | None = None
    input: Any = None  # template; default: the previous output, the join, or the input
    after: list[StepName] | None = None  # dependencies besides the form's own
    join: Join = Join()
    timeout_s: PositiveSeconds | None = None
    on_timeout: OnTimeout = "fail"
    fallback_intent: Token | None = None
    compensate: Token | None = None  # the intent that undoes this step (saga)
    priority: Priority | None = None  # default: the starting task's

    def __post_init__(self) -> None:
        if self.name in RESERVED:
            raise ValueError(f"step name {self.name!r} is reserved")
        if (self.on_timeout == "fallback") != (self.fallback_intent is not None):
            raise ValueError("'fallback_intent' goes with `on_timeout: fallback`, and only with it")
        if self.on_timeout != "fail" and self.timeout_s is None:
            raise ValueError(f"'on_timeout: {self.on_timeout}' needs a timeout_s")
        check_template(self.input)


class FanOut(msgspec.Struct, **_Strict):  # type: ignore[misc]
    branches: list[Step]
    join: Join = Join()
    then: Step | None = None  # the join step; without it the workflow's result is the join

    def __post_init__(self) -> None:
        if len(self.branches) < 2:
            raise ValueError("a fan-out needs at least two branches")
        if self.join.quorum is not None and self.join.quorum > len(self.branches):
            raise ValueError(
                f"quorum {self.join.quorum} is more than the {len(self.branches)} branches"
            )


class When(Comparison, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A condition on the state's result: the value at ``field`` (dotted; "" = all of it)."""

    def holds(self, result: Any) -> bool:
        return self.holds_for(lookup(result, self.field))


class Transition(msgspec.Struct, **_Strict):  # type: ignore[misc]
    """Go ``to`` a state when ``when`` holds for the result, or when ``event`` is signalled;
    with neither, always (an "otherwise", so it goes last)."""

    to: str
    when: When | None = None
    event: Token | None = None

    def __post_init__(self) -> None:
        if self.when is not None and self.event is not None:
            raise ValueError("a transition is taken on a result ('when') or an 'event', not both")


class State(msgspec.Struct, **_Strict):  # type: ignore[misc]
    intent: Token | None = None
    input: Any = None  # template; default: the previous state's output
    next: list[Transition] = []
    terminal: bool = False
    timeout_s: PositiveSeconds | None = None  # bounds the intent's run
    wait_s: PositiveSeconds | None = None  # bounds the wait for one of its events
    on_timeout: str | None = None  # a state to go to past either; else the workflow fails
    on_error: str | None = None  # a state to go to when the intent's task fails for good
    compensate: Token | None = None
    priority: Priority | None = None  # default: the starting task's

    def __post_init__(self) -> None:
        if self.terminal and self.next:
            raise ValueError("a terminal state has no 'next'")
        if not self.terminal and not self.next:
            raise ValueError("a state that is not terminal needs 'next' transitions")
        if self.on_timeout is not None and self.timeout_s is None and self.wait_s is None:
            raise ValueError("'on_timeout' needs a timeout_s or a wait_s")
        if self.timeout_s is not None and self.intent is None:
            raise ValueError(
                "'timeout_s' bounds the state's intent, and this state has none: 'wait_s'"
                " bounds its wait for an event"
            )
        if self.wait_s is not None and not any(t.event for t in self.next):
            raise ValueError("'wait_s' bounds the wait for an event, and no transition has one")
        check_template(self.input)


class Machine(msgspec.Struct, **_Strict):  # type: ignore[misc]
    initial: str
    states: dict[StepName, State]

    def __post_init__(self) -> None:
        names = set(self.states)
        if not names:
            raise ValueError("a state machine needs states: 'states' is empty")
        if self.initial not in names:
            raise ValueError(f"initial state {self.initial!r} is not among the states")
        for name, state in self.states.items():
            jumps = [state.on_timeout, state.on_error]
            for target in [t.to for t in state.next] + [j for j in jumps if j]:
                if target not in names:
                    raise ValueError(f"state {name!r} goes to unknown state {target!r}")
        if not any(state.terminal for state in self.states.values()):
            raise ValueError("a state machine needs a terminal state")
        check_machine_ends(self)


class WorkflowSpec(msgspec.Struct, **_Strict):  # type: ignore[misc]
    """One workflow: exactly one of ``chain``, ``fanout``, ``steps`` (a graph with ``after``)
    or ``states``."""

    chain: list[Step] | None = None
    fanout: FanOut | None = None
    steps: list[Step] | None = None
    states: Machine | None = None
    on_failure: Literal["fail", "compensate"] = "fail"
    ttl_s: PositiveSeconds = 300.0  # the whole workflow's; its starting task's ttl may be sooner

    def __post_init__(self) -> None:
        forms = [f for f in FORMS if getattr(self, f) is not None]
        if len(forms) != 1:
            found = forms or "none"
            raise ValueError(f"a workflow has exactly one of chain, fanout, steps, states: {found}")
        for form in ("chain", "steps"):
            if getattr(self, form) == []:
                raise ValueError(f"a workflow needs at least one step: '{form}' is empty")
        if self.states is None:
            _check_graph(self.graph())
            check_graph_paths(self.graph(), self._places())
        else:
            check_machine_paths(self.states)

    def warnings(self) -> list[str]:
        """What in the definition can never be used (it works, though not as written): a
        state no path enters, a transition an earlier one pre-empts, a ``compensate:`` in a
        workflow that never compensates, a timeout or wait the workflow's ttl_s cuts short, a
        ttl_s past the longest ttl a task may have."""
        found = machine_warnings(self.states) if self.states is not None else []
        if self.on_failure != "compensate":
            kind = "state" if self.states is not None else "step"
            found.extend(
                f"{kind} {name!r}: 'compensate: {undo}' is never used: the workflow has no"
                " 'on_failure: compensate'"
                for name, undo in self._undos()
            )
        found.extend(
            f"{name!r}: {field} {seconds:g} s is never reached: the workflow's ttl_s"
            f" {self.ttl_s:g} s ends it first"
            for name, field, seconds in self._bounds()
            if seconds >= self.ttl_s
        )
        if self.ttl_s > MAX_TTL_MS / 1000:
            found.append(
                f"ttl_s {self.ttl_s:g} s is never reached: the ttl of the task that starts an"
                f" instance ends it first, and a task's ttl is at most {MAX_TTL_MS // 1000} s"
                " (a day)"
            )
        return found

    def _bounds(self) -> list[tuple[str, str, float]]:
        """Each step's or state's ``timeout_s`` and ``wait_s`` that is set."""
        parts = (
            self.states.states.items()
            if self.states is not None
            else ((s.name, s) for s in self.graph())
        )
        return [
            (name, field, seconds)
            for name, part in parts
            for field in ("timeout_s", "wait_s")
            if (seconds := getattr(part, field, None)) is not None
        ]

    def _undos(self) -> list[tuple[str, str]]:
        if self.states is not None:
            return [(n, s.compensate) for n, s in self.states.states.items() if s.compensate]
        return [(s.name, s.compensate) for s in self.graph() if s.compensate]

    @property
    def is_machine(self) -> bool:
        return self.states is not None

    @property
    def form(self) -> str:
        """Which of chain, fanout, steps, states the workflow is."""
        return next(f for f in FORMS if getattr(self, f) is not None)

    def compensation_of(self, key: str) -> str | None:
        """The intent that undoes step (or state) ``key``, if it has one."""
        if self.states is not None:
            return self.states.states[key].compensate
        return next((s.compensate for s in self.graph() if s.name == key), None)

    def _places(self) -> list[str]:
        """Where each step of :meth:`graph` is written in the definition (for errors)."""
        if self.fanout is not None:
            branches = [f"fanout.branches[{i}]" for i in range(len(self.fanout.branches))]
            return [*branches, "fanout.then"]
        form = "chain" if self.chain is not None else "steps"
        return [f"{form}[{i}]" for i in range(len(self.chain or self.steps or []))]

    def graph(self) -> list[Step]:
        """The steps in order, each with every dependency in ``after``; the last is the result."""
        if self.chain is not None:
            return [
                msgspec.structs.replace(
                    step,
                    after=[*([self.chain[i - 1].name] if i else []), *(step.after or [])],
                )
                for i, step in enumerate(self.chain)
            ]
        if self.fanout is not None:
            branches = [
                msgspec.structs.replace(b, after=b.after or []) for b in self.fanout.branches
            ]
            join = self.fanout.then or Step(name="join")
            names = [b.name for b in branches]
            return [*branches, msgspec.structs.replace(join, after=names, join=self.fanout.join)]
        return [msgspec.structs.replace(s, after=s.after or []) for s in self.steps or []]


def _check_graph(graph: list[Step]) -> None:
    names = [s.name for s in graph]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"step names must be unique; repeated: {repeated}")
    for step in graph:
        for dependency in step.after or []:
            if dependency not in names:
                raise ValueError(f"step {step.name!r} is after unknown step {dependency!r}")
    if cycle := cycle_in({s.name: s.after or [] for s in graph}):
        raise ValueError(f"steps wait for each other: cycle: {' → '.join(cycle)}")
    known: set[str] = set()
    for step in graph:  # the last step is the result, so the order is the author's to give
        for dependency in step.after or []:
            if dependency not in known:
                raise ValueError(f"step {step.name!r} must come after {dependency!r}")
        quorum = step.join.quorum
        if quorum is not None and quorum > len(step.after or []):
            raise ValueError(f"step {step.name!r}: quorum {quorum} is more than its dependencies")
        known.add(step.name)
    _check_all_lead_to_the_last(graph)


def _check_all_lead_to_the_last(graph: list[Step]) -> None:
    """The instance completes when its last step does, and stops waiting for any other: a
    step nothing after it waits for, other than the last, would be cut off by that end."""
    before = {s.name: s.after or [] for s in graph}
    reached, pending = set(), [graph[-1].name]
    while pending:
        name = pending.pop()
        if name not in reached:
            reached.add(name)
            pending.extend(before[name])
    if loose := [s.name for s in graph if s.name not in reached]:
        raise ValueError(
            f"steps {loose} lead to no later step: the workflow completes when its last step"
            f" {graph[-1].name!r} does, and would not wait for them; name them in a later"
            " step's `after`"
        )


def cycle_in(edges: dict[str, list[str]]) -> list[str] | None:
    """A cycle of ``edges`` (name → the names it leads to), as a path that ends where it
    starts (``["a", "b", "a"]``), or None when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        path.append(name)
        for following in edges.get(name, []):
            if following in path:
                return [*path[path.index(following) :], following]
            if following not in done and (found := visit(following)):
                return found
        done.add(path.pop())
        return None

    for name in edges:
        if name not in done and (found := visit(name)):
            return found
    return None


def meant(message: str) -> str:
    """``message`` with the field an unknown one may have meant (`timout_s`: 'timeout_s')."""
    unknown = re.search(r"unknown field `([^`]+)`", message)
    if unknown is None:
        return message
    kinds = (Join, Step, FanOut, When, Transition, State, Machine, WorkflowSpec)
    owners = [kind.__name__ for kind in kinds if unknown[1] in kind.__struct_fields__]
    if owners:  # a field of another part: `on_error` on a chain's step, say
        return f"{message} (`{unknown[1]}` belongs to a {_part(owners[0])}, not here)"
    fields = sorted({field for kind in kinds for field in kind.__struct_fields__})
    close = difflib.get_close_matches(unknown[1], fields, n=1)
    return f"{message} (did you mean {close[0]!r}?)" if close else message


def _part(kind: str) -> str:
    """How a definition's part is called in the docs."""
    parts = {"State": "state machine's state", "Machine": "state machine", "FanOut": "fan-out"}
    return parts.get(kind, {"WorkflowSpec": "workflow"}.get(kind, kind.lower()))
