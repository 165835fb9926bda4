"""Publishing a chaos run's tasks at a steady rate, through server restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agentreach import ReachClient
from agentreach.broker import BrokerError
from agentreach.envelopes import Task
from tests.chaos.flows import FLOW
from tests.chaos.plan import ChaosPlan
from tests.chaos.recorder import TOPIC

PUBLISH_RETRY_S = 0.2
STALL_S = 1.0  # publishing this far behind its pace was stalled, not just late

Say = Callable[[str], None]


class Clock:
    """Seconds since the run began, for the log of what happened when."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def __str__(self) -> str:
        return f"{self.elapsed():6.1f}s"


class Publisher:
    """Publishes the plan's tasks at its rate; each publish is retried until the stream has it
    (the same Nats-Msg-Id, so a publish that landed unacknowledged is not doubled)."""

    def __init__(self, client: ReachClient, plan: ChaosPlan) -> None:
        self._client = client
        self._plan = plan
        self.sent: list[str] = []  # the tasks' message ids
        self.flows: list[str] = []  # the workflow instances' ids
        self.retries = 0
        self.finished = False
        self._progress = asyncio.Condition()

    async def run(self, say: Say, clock: Clock) -> None:
        plan, loop = self._plan, asyncio.get_running_loop()
        due = loop.time()
        give_up_s = plan.tasks / plan.rate * 3 + 60
        try:
            async with asyncio.timeout(give_up_s):
                for i in range(plan.tasks):
                    due += 1 / plan.rate
                    if loop.time() - due > STALL_S:  # the server was away: go on from now,
                        due = loop.time()  # steadily, without a burst to catch up
                    await asyncio.sleep(due - loop.time())  # pacing, not a wait for anything
                    payload = {"i": i, "work_ms": plan.work_ms}
                    await self._submit(self._client.task(TOPIC, payload, ttl_ms=plan.ttl_ms))
                    if plan.flows and i % plan.flow_every == 0 and len(self.flows) < plan.flows:
                        flow = self._client.task(FLOW, payload, ttl_ms=plan.ttl_ms)
                        await self._submit(flow, into=self.flows)
        except TimeoutError:
            say(f"[{clock}] publishing gave up after {give_up_s:g} s")
        finally:
            async with self._progress:
                self.finished = True
                self._progress.notify_all()
        flows = f" and {len(self.flows):,} workflows" if self.flows else ""
        say(f"[{clock}] published {len(self.sent):,} tasks{flows} ({self.retries} retries)")

    async def reached(self, count: int) -> bool:
        """Until ``count`` tasks are published (True) or publishing ended short of it."""
        async with self._progress:
            await self._progress.wait_for(lambda: len(self.sent) >= count or self.finished)
            return len(self.sent) >= count

    async def _submit(self, task: Task, *, into: list[str] | None = None) -> None:
        while True:
            try:
                await self._client.submit(task)
                break
            except BrokerError:  # the server is away: the client reconnects meanwhile
                self.retries += 1
                await asyncio.sleep(PUBLISH_RETRY_S)
        (self.sent if into is None else into).append(task.message_id)
        async with self._progress:
            self._progress.notify_all()
