"""Which priorities each sender may use: the fast lane is the operators' to give.

Priorities are isolated (a dispatch stream each, P0 queues kept small, agents serve P0
first), so a sender that marks every task P0 takes the lane from the callers it was meant
for. In a secured deployment (a coordinator with its seal key) operators say who may use
which priority (:class:`~agentreach.coordinator.routing.allowances.SenderPriorities`, kept
current by the agent directory's watch of the allowances bucket), and intake refuses a task
above its sender's: a non-retryable ``priority_not_allowed`` error to the sender, naming the
sender, the priority and what an operator runs to allow it, and a dead letter ``rejected``
(someone may have to act: allow the caller, or ask it to stop). The caller's quota is
charged before this check, so a sender cannot write dead letters faster than its quota.

Only a sender named by the subject (``reach.task.<topic>.<sender>``) is judged: not the
operators' bare form, nor the coordinator's own ``….<topic>._coordinator`` (reassignments,
workflow steps), whose tasks were judged when their caller sent them. Without the seal key
nothing is refused.
"""

from __future__ import annotations

import structlog

from agentreach.broker import Broker
from agentreach.coordinator.delivery.dead_letters import end_with_error
from agentreach.coordinator.routing import allowances
from agentreach.envelopes import PRIORITIES, DecodeError, ErrorInfo, Priority, Task, decode_as

log = structlog.get_logger("coordinator.priorities")

REFUSAL = "priority_not_allowed"  # the error type its sender gets


class PriorityAllowances:
    """Every sender's allowed priorities, as last pushed; judges a task by its sender's."""

    def __init__(self) -> None:
        self.enforced = False  # set with the directory's enforce_allowances
        self._allowed: dict[str, tuple[Priority, ...]] = {}

    def apply(self, sender: str, value: bytes | None) -> None:
        """A change of ``priorities.<sender>`` in the allowances bucket (None: deleted)."""
        record = None
        if value is not None:
            try:
                record = decode_as(value, allowances.SenderPriorities)
            except DecodeError as exc:  # believed as not pushed: the unlisted priorities
                log.warning("unreadable priorities", sender=sender, error=str(exc))
        if record is None or record.sender != sender:
            self._allowed.pop(sender, None)
        else:
            self._allowed[sender] = record.priorities

    def of(self, sender: str) -> tuple[Priority, ...]:
        """What ``sender`` may use: as pushed, or the unlisted priorities."""
        return self._allowed.get(sender, allowances.UNLISTED_PRIORITIES)

    def refusal(self, task: Task) -> ErrorInfo | None:
        """The error refusing ``task``, or None when its sender may use its priority (or
        nothing is enforced, or no sender is named)."""
        sender = task.caller
        if not self.enforced or sender is None or task.priority in self.of(sender):
            return None
        may = self.of(sender)
        wanted = ",".join(p for p in PRIORITIES if p in (*may, task.priority))
        instead = f"send it as {may[0]}, or " if may else ""
        return ErrorInfo(
            type=REFUSAL,
            message=(
                f"caller {sender!r} may not send {task.priority} tasks (it may use"
                f" {','.join(may) or 'none'}): {instead}ask an operator to run"
                f" `reach auth allow {sender} --priorities {wanted}` and `reach auth push`"
                " (the push alone, when `reach auth list` shows it allowed already)"
            ),
            retryable=False,
        )

    async def admit(self, broker: Broker, task: Task) -> bool:
        """True when ``task`` may go on; else it was refused (dead letter ``rejected``, the
        error to its ``reply_to``) and False."""
        error = self.refusal(task)
        if error is None:
            return True
        log.warning("priority refused", caller=task.caller, priority=task.priority)
        await end_with_error(broker, task, "rejected", error, started=False)
        return False
