"""Acting on a workflow instance a caller started: cancelling it
(:meth:`ReachClient.cancel_workflow`) and signalling it an event
(:meth:`ReachClient.signal_workflow`).

A caller may not read the workflow records, so it learns how its instance stands from the
instance's events, before and after it acts, as ``reach trace`` does; the coordinator acts
only on an instance that caller started (caller.md §8.3, §8.4)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from agentreach.agents.errors import (
    DeadlineExceeded,
    InvalidArgument,
    UnknownWorkflow,
    WorkflowActionRefused,
)
from agentreach.broker import Broker, BrokerTimeout, NoResponders
from agentreach.envelopes import ErrorInfo, Event, is_token, now_ms
from agentreach.envelopes import headers as h

# How an instance's events say it ended.
ENDINGS = {
    "workflow_completed": "completed",
    "workflow_failed": "failed",
    "workflow_cancelled": "cancelled",
}
POLL_S = 0.2  # a caller's creds read events only through the coordinator: asked again
CLOCKS_APART_MS = 1_000  # the coordinator's clock may be behind the caller's
# How long a just-published instance may take to start (its task still in the intake): an
# id with no `workflow_started` by then is no instance of the caller's.
START_GRACE_S = 2.0

EventsOf = Callable[[str], Awaitable[list[Event]]]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WorkflowEnded:
    """How a workflow instance ended: ``status`` ``cancelled``, or ``completed`` / ``failed``
    when it ended otherwise; ``before_cancel``: it had ended before the cancel was sent
    (none was); ``at_ms``: when, on the coordinator's clock."""

    instance_id: str
    status: str
    at_ms: int
    before_cancel: bool


@dataclass(frozen=True, slots=True)
class SignalOutcome:
    """What a state machine instance did with a signalled ``event``: ``taken`` by its state
    ``state``, or not — then ``waits_for`` names the events its state takes (empty: it waits
    for none), and ``ended`` how the instance had ended, when it had (no signal was sent),
    or ended instead of taking it (``failed``: the change outgrew its record, say)."""

    instance_id: str
    event: str
    taken: bool
    state: str | None = None
    waits_for: tuple[str, ...] = ()
    ended: str | None = None


class _Instance:
    """One of the caller's instances, as its events tell it."""

    def __init__(self, caller: str, events_of: EventsOf, instance_id: str) -> None:
        self.caller, self.instance_id, self._events_of = caller, instance_id, events_of
        self.trace_id = instance_id

    async def events(self) -> list[Event]:
        return [
            e for e in await self._events_of(self.instance_id) if e.message_id == self.instance_id
        ]

    async def _events_within(self, deadline: float) -> list[Event]:
        """:meth:`events`; none while the coordinator that tells them (on a secured server)
        does not answer yet, until ``deadline``."""
        try:
            return await self.events()
        except (NoResponders, BrokerTimeout):
            if asyncio.get_running_loop().time() >= deadline:
                raise
            return []

    async def started(self, wait_s: float) -> list[Event]:
        """Its events so far, from its ``workflow_started`` (waited for up to ``wait_s``, at
        most START_GRACE_S: a caller may act at once after its publish); raises
        UnknownWorkflow when the caller started no such instance."""
        deadline = asyncio.get_running_loop().time() + min(wait_s, START_GRACE_S)
        while not _has_started(events := await self._events_within(deadline)):
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(POLL_S)
        started = next((e for e in events if e.event == "workflow_started"), None)
        # On an open server the events of every caller's instances can be read: another's is
        # refused here as the coordinator would (it logs that and says nothing).
        if started is None and not events:
            raise UnknownWorkflow(
                f"no workflow instance {self.instance_id!r} among {self.caller}'s own messages"
                f" within {min(wait_s, START_GRACE_S):g} s: not one it started (a caller cancels"
                " and signals only those), or one whose start still waits in the intake (a"
                " leader election, a busy coordinator): try again in a moment"
            )
        if started is None or started.caller not in (None, self.caller):
            raise UnknownWorkflow(
                f"no workflow instance {self.instance_id!r} among {self.caller}'s own messages"
                " (a caller cancels and signals only the instances it started)"
            )
        self.trace_id = started.trace_id
        return events

    async def until(
        self,
        found: Callable[[list[Event]], T | None],
        events: list[Event],
        wait_s: float,
        *,
        says: str,
    ) -> T:
        """What ``found`` finds in the instance's events, read again until it does; raises
        DeadlineExceeded, with ``says`` after the instance's id, after ``wait_s``."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while (answer := found(events)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                raise DeadlineExceeded(
                    f"workflow {self.instance_id!r}: {says}",
                    message_id=self.instance_id,
                    trace_id=self.trace_id,
                )
            await asyncio.sleep(POLL_S)
            try:
                events = await self.events()
            except (NoResponders, BrokerTimeout):
                continue  # a leader election, a coordinator restarting: asked again
        return answer


async def cancel_workflow(
    broker: Broker,
    caller: str,
    events_of: EventsOf,
    instance_id: str,
    *,
    why: str,
    wait_s: float,
) -> WorkflowEnded:
    """Cancel ``instance_id`` as ``caller`` and wait up to ``wait_s`` for it to end;
    ``events_of`` reads a message's events (the caller's own)."""
    instance = _Instance(caller, events_of, instance_id)
    events = await instance.started(wait_s)
    if (ended := _ended(instance_id, events, before_cancel=True)) is not None:
        return ended
    subject = f"{broker.names.workflow_cancel(instance_id)}.{caller}"
    sent = await broker.publish(subject, why.encode(), headers=h.control_headers("cancel"))
    return await instance.until(
        lambda seen: _cancel_answer(instance_id, caller, sent.seq, seen),
        events,
        wait_s,
        says=f"cancel sent; not ended within {wait_s:g} s (its steps' undoing may still run)",
    )


async def signal_workflow(
    broker: Broker,
    caller: str,
    events_of: EventsOf,
    instance_id: str,
    event: str,
    *,
    wait_s: float,
) -> SignalOutcome:
    """Signal ``event`` to ``instance_id`` as ``caller`` and wait up to ``wait_s`` for the
    coordinator to say whether a state took it (its ``signal_taken`` or ``signal_ignored``
    event, which name the sender)."""
    if not is_token(event):
        raise InvalidArgument(
            f"event={event!r}: an event is one subject token (letters, digits, '-', '_'; no"
            " dots, spaces or wildcards)",
            argument="event",
        )
    instance = _Instance(caller, events_of, instance_id)
    events = await instance.started(wait_s)
    if (ended := _ended(instance_id, events, before_cancel=True)) is not None:
        return SignalOutcome(instance_id, event, taken=False, ended=ended.status)
    sent_ms, before = now_ms(), {_said(e) for e in events}
    subject = f"{broker.names.workflow_signal(instance_id, event)}.{caller}"
    sent = await broker.publish(subject, b"", headers=h.control_headers("signal"))
    return await instance.until(
        lambda seen: _answer(instance_id, event, caller, seen, (sent_ms, sent.seq), before),
        events,
        wait_s,
        says=f"{event} signalled; the coordinator has not said within {wait_s:g} s whether a"
        " state took it (it counts from when the server stored it: it may still be taken)",
    )


def _answer(
    instance_id: str,
    event: str,
    caller: str,
    events: list[Event],
    sent: tuple[int, int],
    before: set[tuple[str, int, bytes]],
) -> SignalOutcome | None:
    """The answer to the signal stored at stream sequence ``sent[1]`` (``sent[0]``: when it
    was sent), from the events that name it; from a coordinator that names none (before
    revision 31), the first answer about the event by ``caller`` that came after it."""
    sent_ms, seq = sent
    for seen in events:
        detail = seen.detail
        if detail.get("by") != caller or seen.at_ms < sent_ms - CLOCKS_APART_MS:
            continue
        if _said(seen) in before:  # it answered an earlier signal
            continue
        if detail.get("signal_seq") not in (None, seq):  # another signal's, sent at once
            continue
        if seen.event == "signal_taken" and detail.get("event") == event:
            return SignalOutcome(instance_id, event, taken=True, state=detail.get("state"))
        if seen.event == "signal_ignored" and detail.get("signal") == event:
            if detail.get("error") is not None and detail.get("ended") is None:
                raise _refused(instance_id, f"signal {event}", seen)
            waits = tuple(detail.get("waits_for") or ())
            ended = detail.get("ended")  # the instance failed instead of taking it
            state = detail.get("state")  # the state it is in, which did not take it
            return SignalOutcome(
                instance_id, event, taken=False, state=state, waits_for=waits, ended=ended
            )
    # Ended with no word on the signal (an answer lost in a crash): it is taken no more.
    if (ending := _ended(instance_id, events, before_cancel=False)) is not None:
        return SignalOutcome(instance_id, event, taken=False, ended=ending.status)
    return None


def _cancel_answer(
    instance_id: str, caller: str, seq: int, events: list[Event]
) -> WorkflowEnded | None:
    """How the instance ended after the cancel stored at sequence ``seq``; raises
    WorkflowActionRefused when the coordinator said it did not act on that cancel."""
    if (ended := _ended(instance_id, events, before_cancel=False)) is not None:
        return ended
    for seen in events:
        said = (seen.event, seen.detail.get("by"), seen.detail.get("cancel_seq"))
        if said == ("cancel_refused", caller, seq):
            raise _refused(instance_id, "cancel", seen)
    return None


def _refused(instance_id: str, action: str, answer: Event) -> WorkflowActionRefused:
    """The coordinator's word that it did not act (a caller over its quota)."""
    error = msgspec.convert(answer.detail["error"], ErrorInfo)
    return WorkflowActionRefused(
        f"workflow {instance_id!r}: {action} not acted on: {error.message}",
        error=error,
        instance_id=instance_id,
    )


def _said(event: Event) -> tuple[str, int, bytes]:
    """An event told apart from the others of the instance: one seen before the signal was
    sent answers an earlier signal (the same event sent again within a second, say)."""
    return event.event, event.at_ms, msgspec.json.encode(event.detail)


def _has_started(events: list[Event]) -> bool:
    return any(e.event == "workflow_started" for e in events)


def _ended(instance_id: str, events: list[Event], *, before_cancel: bool) -> WorkflowEnded | None:
    ending = next((e for e in events if e.event in ENDINGS), None)
    if ending is None:
        return None
    return WorkflowEnded(instance_id, ENDINGS[ending.event], ending.at_ms, before_cancel)
