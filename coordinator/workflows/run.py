"""One workflow instance: its coordination record and how it moves on (pure; no I/O).

Each entry point (start, a step's result, a timer, a signal, a cancel) changes
the record and lists the actions it calls for: tasks to dispatch, timers to
arm, notes to publish, the end to announce. The engine writes the record first
(conditionally) and then carries the actions out; they are idempotent (message
ids derive from instance, step and visit), so after a crash :meth:`Run.resume`
may list them all again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import msgspec

from agentreach.coordinator.workflows.actions import (
    Abandon,
    Action,
    Dispatch,
    Finish,
    Note,
    Timer,
    ending,
    started,
)
from agentreach.coordinator.workflows.joins import join_value, readiness
from agentreach.coordinator.workflows.saga import LATE
from agentreach.coordinator.workflows.spec import MAX_STATE_VISITS, Step, WorkflowSpec
from agentreach.coordinator.workflows.taken import remember, said, taken_before
from agentreach.coordinator.workflows.templates import MissingPath, render
from agentreach.coordinator.workflows.visits import Visits, named, timeout_error
from agentreach.envelopes import ErrorInfo, StepRun, WorkflowRecord
from agentreach.envelopes.coordination import SignalTaken

DEADLINE = "_deadline"  # the timer of the whole workflow
WAITING = ".wait"  # "<state>.wait": the timer of a state's wait for its events (its wait_s)
BY_OPERATOR = "cancelled by an operator"  # what a cancel that names no reason says


class Run(Visits):
    """Moves one record on; ``actions`` lists what the engine must then do."""

    def __init__(
        self,
        spec: WorkflowSpec,
        record: WorkflowRecord,
        now_ms: int,
        workflows: Collection[str] = (),
    ) -> None:
        """``workflows``: the names a step's intent runs as a child instance."""
        self.spec = spec
        self.record = record
        self.now = now_ms
        self.workflows = workflows
        self.actions: list[Action] = []
        self._graph = {s.name: s for s in spec.graph()} if not spec.is_machine else {}

    # -- entry points -------------------------------------------------------------
    def start(self) -> None:
        self.actions.append(started(self.record))
        if self._too_deep() or self._past_deadline():
            return
        self.actions.append(Timer(DEADLINE, 0, self.record.deadline_ms))
        if self.spec.states is not None:
            self._enter(self.spec.states.initial, self.record.task.payload)
        else:
            self._advance()

    def on_result(self, message_id: str, *, output: Any = None, error: ErrorInfo | None) -> bool:
        """A step's task ended; False when it is not a step this record waits for."""
        for run in self.record.compensations.values():
            if run.message_id == message_id and run.status == "running":
                self._settle(run, output=output, error=error)
                if self.record.status != "completed":  # a completed one undid a late step
                    self._compensate_next()
                return True
        for key, run in self.record.steps.items():
            if run.message_id == message_id and run.status == "running":
                if self.record.status != "running":
                    self._settle(run, output=output, error=error)
                    return True
                if self.now >= self.record.deadline_ms:  # its timer is late: nothing starts
                    self._settle(run, output=output, error=error)
                    if error is None:  # done, so undone too with on_failure: compensate
                        self.record.completed_order.append(key)
                    self._expire()
                    return True
                self._step_ended(key, run, output=output, error=error)
                return True
            if run.message_id == message_id:
                return self._outcome_of_stopped(key, run, output, error)
        for key, run in self.record.replaced.items():  # a visit stopped, then replaced
            if run.message_id == message_id:
                return self._outcome_of_stopped(key, run, output, error)
        return False

    def on_timer(self, key: str, visit: int) -> bool:
        if key.endswith(LATE):
            return self._late_wait_over(key.removesuffix(LATE), visit)
        if self.record.status != "running":
            return False
        if key == DEADLINE or self.now >= self.record.deadline_ms:
            self._expire()
            return True
        if key.endswith(WAITING):
            return self._wait_over(key, visit)
        run = self.record.steps.get(key)
        if run is None or run.status != "running" or run.visit != visit:
            return False  # it ended in time, or this is an older visit's timer
        self._timed_out(key, run)
        return True

    def on_signal(
        self,
        event: str,
        at_ms: int = 0,
        *,
        by: str | None = None,
        seq: int = 0,
        applied: Callable[[int], bool] = lambda seq: False,
    ) -> bool:
        """An outside event, stored at ``at_ms`` (sent by the caller ``by``, or an operator);
        it moves a state machine whose state waits for it, and not one whose wait ended
        before it came (its timer moves it on). One taken before (delivered again after a
        server crash) moves nothing: what it called for is done again, and said again.
        ``applied``: whether a signal's acknowledgement is known applied (not kept)."""
        if (earlier := taken_before(self.record, seq)) is not None:
            # An ended one's ending too: the crash may have come between the record's write
            # and it (the outbox says it again only when its event is not stored).
            self.resume()
            self.actions.append(Note("signal_taken", detail=said(earlier)))
            return True
        machine, current = self.spec.states, self.record.current
        if machine is None or current is None or self.record.status != "running":
            return False
        for transition in machine.states[current].next:
            if transition.event == event:
                if self._past_deadline():
                    return True
                run = self.record.steps[current]
                if (waiting := self._wait_timer()) is not None and at_ms > waiting.due_ms:
                    return False
                given = run.input if run.status == "running" else run.output  # no result yet
                if run.status == "running":
                    self._stop(current, run, "cancelled")
                taken = SignalTaken(seq=seq, event=event, state=current, visit=run.visit, by=by)
                remember(self.record, taken, applied)
                self.actions.append(Note("signal_taken", detail=said(taken)))
                self._enter(transition.to, given)
                return True
        return False

    def cancel(self, why: str = BY_OPERATOR) -> bool:
        if self.record.status != "running":
            return False
        running = self._cancel_leftovers()
        cancelled = ErrorInfo(type="cancelled", message=why, retryable=False)
        self._end_badly(cancelled, "cancelled", running=running)
        return True

    def outgrow(self, error: ErrorInfo) -> bool:
        """End as failed, ``error`` saying why: the record, with what the last message
        added, would not fit in one message of the server."""
        if self.record.status != "running":
            return False
        self._fail(error)
        return True

    def outgrown_by(self, message_id: str, error: ErrorInfo) -> bool:
        """The outcome of ``message_id`` would not fit in the record. A step's result: the
        step ran, so it is completed (its output not kept) and undone with the others as the
        instance fails. Any other outcome (an undo's, a stopped step's) is taken without it."""
        for key, run in self.record.steps.items():
            if run.message_id == message_id and run.status == "running":
                if self.record.status != "running":
                    break
                self._settle(run, output=None, error=None)
                self.record.completed_order.append(key)
                return self.outgrow(named(f"step {key!r}'s result", error))
        return self.on_result(message_id, output=None, error=None)

    def resume(self) -> None:
        """Every action the record's present state calls for (after a crash, say)."""
        record = self.record
        for key, run in record.steps.items():  # a child let go just before a crash, say
            if run.status in ("cancelled", "timed_out"):
                self.actions.append(Abandon(key, run))
        if record.finished:
            self.actions.extend((Finish(again=True), ending(record, again=True)))
            for key, run in record.compensations.items():  # a completed one's late step
                if run.status == "running":
                    self.actions.append(Dispatch(f"{key}-undo", run, unless_routed=True))
            return
        self.actions.append(Timer(DEADLINE, 0, record.deadline_ms))
        for key, run in record.steps.items():
            if run.status == "running":
                self.actions.append(Dispatch(key, run, unless_routed=True))
                if run.deadline_ms:
                    self.actions.append(Timer(key, run.visit, run.deadline_ms))
        if (waiting := self._wait_timer()) is not None:
            self.actions.append(waiting)
        for key, run in record.compensations.items():
            if run.status == "running":
                self.actions.append(Dispatch(f"{key}-undo", run, unless_routed=True))
        self.actions.extend(self._late_timers())

    # -- graphs (chain, fan-out, steps) -------------------------------------------
    def _advance(self) -> None:
        """Start every step whose dependencies allow it; finish when the last step is done."""
        progressed = True
        while progressed and self.record.status == "running":
            progressed = False
            for step in self._graph.values():
                run = self.record.steps.get(step.name)
                if self.record.status != "running":  # a step just failed the instance
                    return
                if run is not None and run.status != "waiting":
                    continue
                verdict, why = readiness(step, self.record.steps)
                if verdict == "impossible":
                    self._fail(ErrorInfo(type="join_failed", message=why, retryable=False))
                    return
                if verdict == "ready":
                    self._start_step(step)
                    progressed = True
        final = self.record.steps.get(list(self._graph)[-1])
        if self.record.status == "running" and final is not None and final.status == "completed":
            self._complete(final.output)

    def _start_step(self, step: Step, *, intent: str | None = None) -> None:
        try:
            payload = self._input_of(step)
        except MissingPath as exc:
            failed = self._input_missing(step.name, intent or step.intent, exc)
            if failed.error is not None and not self._tolerated(step.name):
                self._fail(failed.error)
            return
        run = self._begin(step.name, intent or step.intent, payload, step.timeout_s, step.priority)
        # Without an intent the input passes through at once; _advance's loop carries on.
        if run.status == "completed":
            self.record.completed_order.append(step.name)

    def _input_of(self, step: Step) -> Any:
        after = step.after or []
        outputs = self._outputs()
        if not after:
            default = self.record.task.payload
        elif len(after) == 1:
            default = outputs.get(after[0])
        else:
            default = join_value(after, self.record.steps)
        if step.input is None:
            return default
        context = {"input": self.record.task.payload, "prev": default, **outputs}
        if len(after) > 1:
            context.update(default)
        # A step its join went on without has no output: a path into it gives null.
        return render(step.input, context, frozenset(self._graph) - outputs.keys())

    def _step_ended(self, key: str, run: StepRun, *, output: Any, error: ErrorInfo | None) -> None:
        self._settle(run, output=output, error=error)
        if self.spec.states is not None:
            self._state_ended(key, run)
            return
        if error is None:
            self._completed(key)
            return
        if self._tolerated(key):
            self._advance()
        else:
            self._fail(named(f"step {key!r}", error))

    def _completed(self, key: str) -> None:
        """A graph step is done: remember the order (for the saga), start what it unblocks."""
        self.record.completed_order.append(key)
        self._advance()

    def _tolerated(self, key: str) -> bool:
        """A step may fail when every step after it only needs some of its dependencies."""
        dependents = [s for s in self._graph.values() if key in (s.after or [])]
        return bool(dependents) and all(s.join.policy != "all" for s in dependents)

    def _timed_out(self, key: str, run: StepRun) -> None:
        if self.spec.states is not None:
            state = self.spec.states.states[key]
            self._stop(key, run, "timed_out")
            run.error = timeout_error(key, state.timeout_s, "state")
            self.actions.append(Note("step_timed_out", key, {"visit": run.visit}))
            self._state_timed_out(key, run.error, stopped=[key])
            return
        step = self._graph[key]
        run.error = timeout_error(key, step.timeout_s)
        self.actions.append(Note("step_timed_out", key, {"visit": run.visit}))
        self._stop(key, run, "timed_out")
        if step.on_timeout == "fallback":
            self._start_step(step, intent=step.fallback_intent)
            return
        if step.on_timeout == "partial":
            self._advance()
        else:  # its task may still complete: with a saga, it is waited for and undone first
            self._fail(run.error, stopped=[key])

    # -- state machines -----------------------------------------------------------
    def _enter(self, name: str, given: Any) -> None:
        assert self.spec.states is not None
        if len(self.record.path) >= MAX_STATE_VISITS:
            message = f"it would enter more than {MAX_STATE_VISITS} states: a loop?"
            self._fail(ErrorInfo(type="too_many_states", message=message, retryable=False))
            return
        self.record.current = name
        self.record.path.append(name)
        state = self.spec.states.states[name]
        payload = given
        if state.input is not None:
            context = {"input": self.record.task.payload, "prev": given, **self._outputs()}
            try:
                payload = render(state.input, context)
            except MissingPath as exc:
                self._state_ended(name, self._input_missing(name, state.intent, exc))
                return
        run = self._begin(name, state.intent, payload, state.timeout_s, state.priority)
        if run.status == "completed":
            self._state_ended(name, run)

    def _state_ended(self, name: str, run: StepRun) -> None:
        assert self.spec.states is not None
        state = self.spec.states.states[name]
        if run.error is not None:
            if state.on_error:
                self._enter(state.on_error, {"error": msgspec.to_builtins(run.error)})
            else:
                self._fail(named(f"state {name!r}", run.error))
            return
        self.record.completed_order.append(name)
        if state.terminal:
            self._complete(run.output)
            return
        for transition in state.next:
            if transition.event is None and (
                transition.when is None or transition.when.holds(run.output)
            ):
                self._enter(transition.to, run.output)
                return
        if not any(t.event for t in state.next):
            message = f"no transition from state {name!r} matches its result"
            self._fail(ErrorInfo(type="no_transition", message=message, retryable=False))
            return
        # Wait here for one of the state's events: the deadline is the wait's from now on.
        run.deadline_ms = self.now + int(state.wait_s * 1000) if state.wait_s else 0
        if (waiting := self._wait_timer()) is not None:
            self.actions.append(waiting)

    def _wait_timer(self) -> Timer | None:
        """The timer of the current state's wait for its events, if it waits for a while."""
        machine, current = self.spec.states, self.record.current
        if machine is None or current is None or machine.states[current].wait_s is None:
            return None
        run = self.record.steps[current]
        return (
            Timer(current + WAITING, run.visit, run.deadline_ms)
            if run.status == "completed"
            else None
        )

    def _wait_over(self, key: str, visit: int) -> bool:
        """A state waited its ``wait_s`` and none of its events came."""
        waiting = self._wait_timer()
        if waiting is None or (waiting.key, waiting.visit) != (key, visit):
            return False  # an event came in time, or this is an older visit's timer
        assert self.spec.states is not None and self.record.current is not None
        name = self.record.current
        state = self.spec.states.states[name]
        events = [t.event for t in state.next if t.event]
        message = f"state {name!r} waited {state.wait_s:g} s for {' or '.join(events)}: none came"
        self.actions.append(Note("step_timed_out", name, {"visit": visit, "waited_for": events}))
        self._state_timed_out(name, ErrorInfo(type="timeout", message=message, retryable=False))
        return True

    def _state_timed_out(
        self, name: str, error: ErrorInfo, stopped: list[str] | None = None
    ) -> None:
        assert self.spec.states is not None
        target = self.spec.states.states[name].on_timeout
        if target:
            self._enter(target, {"timed_out": name})
        else:
            self._fail(error, stopped=stopped)
