"""What a handler gets besides its payload: the envelope, the clock, a way to report."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from agentreach.agents.deadline import Deadline
from agentreach.agents.errors import SyncCallOnLoop
from agentreach.envelopes import Priority, Task, now_ms, sub_task_id, tracecontext
from agentreach.logs import get_logger

log = get_logger("agents")

# Sends a sub-task as this agent and waits for its result: (task, ack_deadline_ms, result_type).
Invoke = Callable[[Task, int, Any], Awaitable[Any]]


class TaskContext:
    """The task being handled, its remaining time, and progress reporting.

    ``remaining_ms()`` counts down to the handler's deadline on the monotonic clock: the
    intent's ``deadline_ms`` (restarted by each :meth:`progress`), never past the
    envelope's execute budget.
    """

    def __init__(
        self,
        envelope: Task,
        *,
        agent_id: str,
        deadline: Deadline,
        report_progress: Callable[[str], Awaitable[None]],
        submit: Callable[[Task], Awaitable[None]],
        invoke: Invoke | None = None,
        loop: asyncio.AbstractEventLoop,
        resumed: bool = False,
    ) -> None:
        self.envelope = envelope
        self.agent_id = agent_id
        # A run of this very attempt began before and did not finish (its process died):
        # what that run did may have happened already. Keyed effects need not look.
        self.resumed = resumed
        self._deadline = deadline
        self._report_progress = report_progress
        self._submit = submit
        self._invoke = invoke
        self._loop = loop
        self._children = 0  # sub-tasks made so far: the next one's default key

    @property
    def message_id(self) -> str:
        return self.envelope.message_id

    @property
    def trace_id(self) -> str:
        return self.envelope.trace_id

    @property
    def topic(self) -> str:
        return self.envelope.topic

    @property
    def attempt(self) -> int:
        return self.envelope.attempt

    @property
    def deadline_ms(self) -> int:
        """The handler's deadline in ms after its start (progress may move it later)."""
        return self._deadline.total_ms

    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` of this hop, to join the caller's OpenTelemetry trace."""
        return self.envelope.traceparent

    def elapsed_ms(self) -> int:
        return int((self._loop.time() - self._deadline.started) * 1000)

    def remaining_ms(self) -> int:
        """Milliseconds left before this handler's deadline (never negative)."""
        return self._deadline.left_ms()

    async def progress(self, note: str = "") -> None:
        """Tell the sender the task is still being worked on: this keeps the message from
        redelivery, and gives the handler its intent's ``deadline_ms`` again (within the
        task's execute budget), its claim extended to match."""
        await self._report_progress(note)

    def progress_sync(self, note: str = "", timeout: float = 5.0) -> None:
        """:meth:`progress` for a synchronous handler running in a worker thread. A report
        that takes longer than ``timeout`` goes on without the handler, which goes on too (a
        TimeoutError here would fail its work as ``deadline_exceeded``)."""
        self._off_the_loop("progress_sync", "await ctx.progress(…)")
        future = asyncio.run_coroutine_threadsafe(self._report_progress(note), self._loop)
        try:
            future.result(timeout)
        except TimeoutError:
            log.warning("progress not reported yet; the handler goes on", timeout_s=timeout)

    async def publish(
        self, topic: str, payload: Any, *, priority: Priority | None = None, key: str | None = None
    ) -> Task:
        """Send a task to another agent in the same trace, passing on the budget that is left;
        nobody waits for its result. Its id is derived from this task's and ``key`` (see
        :meth:`child_task`): a run of this handler again sends it again under the same id,
        and it runs once."""
        task = self.child_task(topic, payload, priority=priority, key=key)
        await self._submit(task)
        return task

    async def invoke(
        self,
        topic: str,
        payload: Any,
        *,
        priority: Priority | None = None,
        key: str | None = None,
        ack_deadline_ms: int | None = None,
        result_type: Any = None,
    ) -> Any:
        """Send a sub-task and wait for its result, within the time this handler has left:
        ``ReachClient.invoke`` as this agent (its errors), in the same trace, at this task's
        priority unless given, its ttl and execute budget what is left of this handler's
        deadline. Its id is derived from this task's and ``key`` (see :meth:`child_task`):
        this handler run again (redelivered after a crash, retried) attaches to the sub-task
        sent before instead of running it twice, and hears how it ended; a sub-task that
        failed fails the same way again (give a ``key`` that includes ``self.attempt`` to try
        it anew on a retry). ``ack_deadline_ms``: how long it may wait to be accepted (by
        default all the time left: a busy agent's queue is no failure while there is time).
        ``result_type`` converts the result (``msgspec.convert``). A handler that fails by
        letting such an error through fails as ``sub_task_failed``, which does not count
        against this agent's health."""
        if self._invoke is None:
            raise RuntimeError("this TaskContext cannot invoke (made outside an agent)")
        task = self.child_task(topic, payload, priority=priority, key=key)
        ack_ms = task.ttl_ms if ack_deadline_ms is None else min(ack_deadline_ms, task.ttl_ms)
        return await self._invoke(task, ack_ms, result_type)

    def invoke_sync(self, topic: str, payload: Any, **options: Any) -> Any:
        """:meth:`invoke` for a synchronous handler running in a worker thread: waits for
        the sub-task's result in this thread (the options are :meth:`invoke`'s)."""
        self._off_the_loop("invoke_sync", "await ctx.invoke(…)")
        call = self.invoke(topic, payload, **options)
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def _off_the_loop(self, call: str, instead: str) -> None:
        """Raise SyncCallOnLoop when called on the agent's event loop: waiting there for
        what that loop must run deadlocked the agent for good (SIGTERM ignored)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return  # a worker thread: no loop runs here
        if running is self._loop:
            raise SyncCallOnLoop(
                f"ctx.{call}() called from an async handler, on the agent's event loop: it"
                f" would wait for the loop it blocks; use {instead} there (the *_sync calls"
                " are for plain def handlers, which run in worker threads)"
            )

    def child_task(
        self, topic: str, payload: Any, *, priority: Priority | None = None, key: str | None = None
    ) -> Task:
        """A task for another agent in the same trace, with the budget that is left. Its id
        is :func:`~agentreach.envelopes.sub_task_id` of this task's id, this agent's and
        ``key``, by default the number of sub-tasks this run made before it plus one ("1",
        "2", …): the same in every run of a handler that makes its sub-tasks in the same
        order, in this agent (another agent the task moves to sends its own)."""
        self._children += 1
        remaining = max(1, self.remaining_ms())
        budget = msgspec.structs.replace(
            self.envelope.budget, execute_ms=min(self.envelope.budget.execute_ms, remaining)
        )
        parent = self.envelope
        name = str(self._children) if key is None else key
        message_id = sub_task_id(parent.message_id, parent.created_at or 0, self.agent_id, name)
        return Task(
            v=1,
            message_id=message_id,
            trace_id=self.trace_id,
            traceparent=tracecontext.child(self.envelope.traceparent, message_id),
            topic=topic,
            payload=payload,
            from_agent=self.agent_id,
            ttl_ms=remaining,
            priority=priority or self.envelope.priority,
            budget=budget,
            created_at=now_ms(),
        )
