"""What can run before what in a workflow definition (pure), for two checks made at load:

- an input path (``"$.plan.outline"``) may name only a step that has run when its step
  starts: one it comes after (a chain's earlier steps, a graph's ``after``, transitively), or
  a state from which the machine can reach the state that names it. Another would give
  nothing at run time, always or depending on timing, so the definition is refused;
- a state machine's parts that can never be used are reported as warnings: states that no
  path from ``initial`` enters, and transitions that an earlier "otherwise" (no ``when``, no
  ``event``) always pre-empts. A machine from whose ``initial`` no terminal state can be
  reached could never complete, and is refused.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentreach.coordinator.workflows.templates import paths_of

if TYPE_CHECKING:
    from agentreach.coordinator.workflows.spec import Machine, State, Step

RESERVED = frozenset({"input", "prev", "results", "missing"})
JOINED = frozenset({"results", "missing"})  # only a step after several has them: a join's


def check_graph_paths(graph: list[Step], where: list[str]) -> None:
    """Refuse an input path of a step that names a step it does not come after, or a join's
    ``results`` / ``missing`` in a step that is no join; ``where`` is each step's place in
    the definition (``fanout.branches[0]``), said in the error."""
    before = {s.name: s.after or [] for s in graph}
    names = set(before)
    for step, at in zip(graph, where, strict=True):
        earlier = _closure(step.name, before)
        reserved = RESERVED if len(step.after or []) > 1 else RESERVED - JOINED
        located = f" - at `$.{at}.input`"
        for path in paths_of(step.input):
            root = path.split(".", 1)[0]
            if root in reserved or root in earlier:
                continue
            if root in JOINED:
                raise ValueError(
                    f"step {step.name!r}: the input path '$.{path}' names the join's {root!r},"
                    f" which only a step after several others has (a fan-out's `then`);"
                    f" {_may_name('step', step.name, reserved, earlier)}{located}"
                )
            if root not in names:
                _no_such(step.name, "step", path, reserved | earlier, located)
            raise ValueError(
                f"step {step.name!r}: the input path '$.{path}' names step {root!r}, which does"
                f" not run before {step.name!r}"
                f" ({_may_name('step', step.name, reserved, earlier)}){located}"
            )


def check_machine_paths(machine: Machine) -> None:
    """Refuse an input path of a state that names a state the machine cannot have been in
    before it (or a join's parts: a state has none)."""
    edges = {name: targets_of(state) for name, state in machine.states.items()}
    reserved = RESERVED - JOINED
    for name, state in machine.states.items():
        before = {s for s in edges if name in reachable(edges, edges[s])}
        located = f" - at `$.states.states.{name}.input`"
        for path in paths_of(state.input):
            root = path.split(".", 1)[0]
            if root in reserved or root in before:
                continue
            if root not in edges and root not in JOINED:
                _no_such(name, "state", path, reserved | before, located)
            what = (
                f"the join's {root!r}, which a state never has"
                if root in JOINED
                else (
                    f"state {root!r}, from which {name!r} cannot be reached: it never runs"
                    f" before {name!r}"
                )
            )
            raise ValueError(
                f"state {name!r}: the input path '$.{path}' names {what}"
                f" ({_may_name('state', name, reserved, before)}){located}"
            )


def check_machine_ends(machine: Machine) -> None:
    """Refuse a machine that can never reach a terminal state from ``initial``."""
    edges = {name: targets_of(state) for name, state in machine.states.items()}
    entered = reachable(edges, [machine.initial])
    if not any(machine.states[name].terminal for name in entered):
        raise ValueError(
            f"no terminal state can be reached from initial state {machine.initial!r}"
            f" (it leads only to {', '.join(sorted(entered))}): the workflow could never"
            " complete"
        )


def machine_warnings(machine: Machine) -> list[str]:
    """What in ``machine`` can never be used, one sentence each."""
    edges = {name: targets_of(state) for name, state in machine.states.items()}
    entered = reachable(edges, [machine.initial])
    found = [
        f"state {name!r} is never entered: no transition from initial state"
        f" {machine.initial!r} leads to it"
        for name in machine.states
        if name not in entered
    ]
    for name, state in machine.states.items():
        found.extend(_dead_transitions(name, state))
        found.extend(_repeated_events(name, state))
    return found


def _repeated_events(name: str, state: State) -> Iterable[str]:
    """A second transition on an event the state already goes on: the first always wins."""
    first: dict[str, int] = {}
    for i, transition in enumerate(state.next):
        if not transition.event:
            continue
        if transition.event not in first:
            first[transition.event] = i
            continue
        earlier = first[transition.event]
        yield (
            f"state {name!r}: transition {i + 1} (to {transition.to!r}, on event"
            f" {transition.event!r}) is never taken: transition {earlier + 1} (to"
            f" {state.next[earlier].to!r}) is on the same event and comes before it"
        )


def _dead_transitions(name: str, state: State) -> Iterable[str]:
    """Transitions listed after an "otherwise": a result always takes the otherwise; an
    event still counts while the state's intent runs, never once it has ended (a state
    without an intent ends at once)."""
    otherwise = next((i for i, t in enumerate(state.next) if t.when is None and not t.event), None)
    if otherwise is None:
        return
    for i, transition in enumerate(state.next[otherwise + 1 :], start=otherwise + 1):
        if transition.event and state.intent:
            continue
        if transition.event:
            what = f"on event {transition.event!r}"
        else:
            what = "on its 'when'" if transition.when else "with no 'when' either"
        yield (
            f"state {name!r}: transition {i + 1} (to {transition.to!r}, {what}) is never"
            f" taken: transition {otherwise + 1} (to {state.next[otherwise].to!r}) has no"
            " 'when' and comes before it; put the otherwise last"
        )


def targets_of(state: State) -> list[str]:
    """The states ``state`` may go to."""
    jumps = [state.on_timeout, state.on_error]
    return [t.to for t in state.next] + [j for j in jumps if j]


def reachable(edges: Mapping[str, list[str]], starts: Iterable[str]) -> set[str]:
    """Every name reached from ``starts`` (them included) along ``edges``."""
    reached: set[str] = set()
    pending = list(starts)
    while pending:
        name = pending.pop()
        if name not in reached:
            reached.add(name)
            pending.extend(edges.get(name, []))
    return reached


def _closure(name: str, before: Mapping[str, list[str]]) -> set[str]:
    """The steps ``name`` comes after, directly or through others."""
    return reachable(before, before.get(name, [])) - {name}


def _may_name(kind: str, owner: str, reserved: Iterable[str], earlier: Iterable[str]) -> str:
    """What a path in ``owner`` may start at."""
    comes = f"a step {owner!r} comes after" if kind == "step" else f"a state before {owner!r}"
    return f"a path may name {', '.join(sorted(reserved))}, or {comes}: {_listed(earlier)}"


def _no_such(owner: str, kind: str, path: str, valid: set[str], located: str) -> Any:
    """Refuse a path whose first name is nothing at all, suggesting the closest valid one."""
    root = path.split(".", 1)[0]
    close = difflib.get_close_matches(root, sorted(valid), n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"{kind} {owner!r}: the input path '$.{path}' names no {kind}{guess} (a path here"
        f" starts at {', '.join(sorted(valid))}){located}"
    )


def _listed(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names)) or "none"
