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

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentreach.coordinator.workflows.templates import paths_of

if TYPE_CHECKING:
    from agentreach.coordinator.workflows.spec import Machine, State, Step

RESERVED = frozenset({"input", "prev", "results", "missing"})


def check_graph_paths(graph: list[Step]) -> None:
    """Refuse an input path of a step that names a step it does not come after."""
    before = {s.name: s.after or [] for s in graph}
    names = set(before)
    for step in graph:
        earlier = _closure(step.name, before)
        for path in paths_of(step.input):
            root = path.split(".", 1)[0]
            if root in RESERVED or root in earlier:
                continue
            if root not in names:
                _no_such(step.name, "step", path, names)
            raise ValueError(
                f"step {step.name!r}: the input path '$.{path}' names step {root!r}, which does"
                f" not run before {step.name!r} (a path may name {', '.join(sorted(RESERVED))},"
                f" or a step {step.name!r} comes after: {_listed(earlier)})"
            )


def check_machine_paths(machine: Machine) -> None:
    """Refuse an input path of a state that names a state the machine cannot have been in
    before it."""
    edges = {name: targets_of(state) for name, state in machine.states.items()}
    for name, state in machine.states.items():
        for path in paths_of(state.input):
            root = path.split(".", 1)[0]
            if root in RESERVED:
                continue
            if root not in edges:
                _no_such(name, "state", path, set(edges))
            if name not in reachable(edges, edges[root]):
                raise ValueError(
                    f"state {name!r}: the input path '$.{path}' names state {root!r}, from"
                    f" which {name!r} cannot be reached: it never runs before {name!r}"
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
    return found


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
        what = f"event {transition.event!r}" if transition.event else "its 'when'"
        yield (
            f"state {name!r}: transition {i + 1} (to {transition.to!r}, on {what}) is never"
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


def _no_such(owner: str, kind: str, path: str, names: set[str]) -> Any:
    known = sorted(RESERVED | names)
    raise ValueError(
        f"{kind} {owner!r}: the input path '$.{path}' names no {kind}; a path starts at"
        f" {', '.join(known)}"
    )


def _listed(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names)) or "none"
