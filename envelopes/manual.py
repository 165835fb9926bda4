"""A task waiting for a person: the record in ``reach_manual`` (key: the task's message id).

The coordinator writes it when a task goes to a manual-review queue (its intent was not sure
enough, or a rule sends it there); people and programs take it, answer it or send it on, each
step a compare-and-set on the record, so two people never answer the same task; or reject
it. The coordinator then carries the step out (the answer to the caller, the task to its new
topic, a rejection to the DLQ as ``rejected`` and to the caller as its error) and marks it
``delivered_ms``. An item whose task is a workflow step the workflow no longer
waits for (cancelled, ended, the step stopped) is ``withdrawn``, saying why: nobody may
answer it any more.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentreach.envelopes.messages import Task

ManualStatus = Literal["waiting", "taken", "answered", "sent", "rejected", "expired", "withdrawn"]
OPEN: tuple[ManualStatus, ...] = ("waiting", "taken")


class ManualItem(msgspec.Struct, frozen=True, kw_only=True):
    """One task in a manual-review queue, and what became of it."""

    v: Literal[1] = 1
    message_id: str
    queue: str
    task: Task
    reason: str  # why a person must look: the rule, the confidence and what it needed
    rule: str = ""
    entered_ms: int = 0
    deadline_ms: int = 0  # still open then: dead-lettered as expired
    status: ManualStatus = "waiting"
    taken_by: str = ""
    taken_until_ms: int = 0  # a take lapses then, and anyone may take the item
    answer: Any = None
    sent_to: str = ""  # the topic a person sent the task on to ...
    sent_as: str = ""  # ... as a new message with this id
    ended_by: str = ""
    ended_ms: int = 0
    delivered_ms: int = 0  # when the coordinator carried out the answer or the send
    withdrawn: str = ""  # why it was withdrawn: its workflow no longer waits for the task
    rejected: str = ""  # why the person who rejected it did so

    @property
    def open(self) -> bool:
        """Whether the item still waits for someone (waiting, or taken and not done)."""
        return self.status in OPEN

    def withdraw(self, why: str, now_ms: int) -> ManualItem | None:
        """This item withdrawn (its task is a workflow step the workflow no longer waits
        for), or None when there is nothing to withdraw: it expired, was withdrawn, or what
        a person decided was carried out already."""
        if self.status in ("expired", "withdrawn") or self.delivered_ms:
            return None
        return msgspec.structs.replace(self, status="withdrawn", withdrawn=why, ended_ms=now_ms)

    def holder(self, now_ms: int) -> str:
        """Who holds the item now: the person whose take has not lapsed, or ""."""
        if self.status == "taken" and now_ms < self.taken_until_ms:
            return self.taken_by
        return ""
