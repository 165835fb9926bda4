"""Room in an agent. A handler's ``capacity`` is how many of its tasks run at once, whatever
their priority (its places); each priority has a pool of slots too, as many as all handlers
have places, and holds twice that many deliveries (so the next task is in hand while one
runs and the outcome of the last is being recorded). A way to wait for either, and the
handler latency an agent advertises with its free slots."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Mapping
from typing import Literal

from agentreach.broker import Delivery
from agentreach.envelopes import PRIORITIES, Priority, Task

Entry = Literal["entered", "stopping", "expired"]


class WorkerPool:
    """``size`` places, taken and given back one at a time, and a way to wait for one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.size - self.busy

    async def wait_free(self) -> None:
        """Until a place is free (take it before the next await)."""
        while self.free <= 0:
            self._freed.clear()
            await self._freed.wait()

    def take(self) -> None:
        self.busy += 1

    def give(self) -> None:
        self.busy -= 1
        self._freed.set()


class HandlerPlaces:
    """The ``size`` places of one handler, shared by the three priorities. A place that
    frees passes straight to the most urgent task waiting for one (P0 before P1 before P2,
    in order of arrival within a priority): a running task is never cut short, but an
    urgent one is next. With two places or more, P1 and P2 never take the last free one: a
    P1/P2 backlog cannot hold every place while P0 waits."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        # (priority, arrival, turn): "P0" < "P1" < "P2", so the heap's head is the most urgent
        self._waiting: list[tuple[Priority, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def free(self) -> int:
        return self.size - self.busy

    def free_to(self, priority: Priority) -> int:
        """Places a task of ``priority`` could take now (P1/P2 not the one kept for P0)."""
        return max(0, self.free - self._kept_for_p0(priority))

    def try_take(self, priority: Priority) -> bool:
        """A place for a task of ``priority`` now, if one is free to it and no task waits."""
        if self._waiting or self.free <= self._kept_for_p0(priority):
            return False
        self.busy += 1
        return True

    async def take(self, priority: Priority) -> None:
        """A place for a task of ``priority``: at once when its turn is now (without
        suspending), else when it comes."""
        if self.try_take(priority):
            return
        entry = (priority, next(self._arrivals), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting, entry)
        self._hand_out()
        try:
            await entry[2]  # done already: no suspension
        except asyncio.CancelledError:
            if entry[2].done() and not entry[2].cancelled():
                self.give()  # handed over just as the wait was given up: pass it on
            else:
                with contextlib.suppress(ValueError):  # a hand-out may have dropped it
                    self._waiting.remove(entry)
                    heapq.heapify(self._waiting)
            raise

    def give(self) -> None:
        """Give a place back: to the next task waiting that may take it, else to the free
        ones."""
        self.busy -= 1
        self._hand_out()

    def _hand_out(self) -> None:
        """Free places to the most urgent waiting tasks, as far as each may take one."""
        while self._waiting:
            priority, _, turn = self._waiting[0]
            if turn.done():  # given up meanwhile
                heapq.heappop(self._waiting)
                continue
            if self.free <= self._kept_for_p0(priority):
                return  # whoever waits behind is no more urgent
            heapq.heappop(self._waiting)
            self.busy += 1
            turn.set_result(None)

    def _kept_for_p0(self, priority: Priority) -> int:
        return 1 if self.size > 1 and priority != "P0" else 0


class Room:
    """Where tasks run: a place of their handler (its ``capacity``, shared by the three
    priorities) and a slot of their priority's pool, both taken when a task is accepted and
    given back when its handler ends. A pool has as many slots as all handlers have places,
    so a place of a handler comes with a free slot; the handlers' places are the limit."""

    def __init__(self, capacities: Mapping[str, int], *, stopping: asyncio.Event) -> None:
        self.places = {topic: HandlerPlaces(size) for topic, size in capacities.items()}
        self.slots = {p: WorkerPool(sum(capacities.values())) for p in PRIORITIES}
        self._stopping = stopping

    @property
    def running(self) -> int:
        """Tasks running now (all priorities)."""
        return sum(place.busy for place in self.places.values())

    @property
    def free(self) -> int:
        """Tasks that could start now, were they of the right topics: the handlers' free
        places (the slots of any one priority are at least as many)."""
        return sum(place.free for place in self.places.values())

    def free_for(self, task: Task) -> int:
        """More tasks of ``task``'s topic and priority that could start now (an ack says it:
        a P1 place kept for P0 is no room for the caller's next P1 task)."""
        return max(0, min(self._place(task).free_to(task.priority), self.slots[task.priority].free))

    async def enter(
        self, task: Task, delivery: Delivery, *, keep_alive_s: float, within_s: float
    ) -> Entry:
        """Take a place of the task's handler and a slot of its priority, waiting for one
        with the delivery kept alive meanwhile (a place frees when a handler ends, which may
        take longer than the ack wait), for up to ``within_s`` (what is left of its ttl).
        ``stopping`` when the agent began to stop first (a stopping agent starts nothing
        new), ``expired`` when the wait outlasted the ttl: both without a place."""
        place, slot = self._place(task), self.slots[task.priority]
        if self._stopping.is_set():
            return "stopping"
        if slot.free > 0 and place.try_take(task.priority):
            slot.take()
            return "entered"
        async with delivery.kept_alive(keep_alive_s):
            if (entry := await self._take(place, task.priority, within_s)) != "entered":
                return entry
            while slot.free <= 0:  # only for a handler added after the start (not sized in)
                await slot.wait_free()
            slot.take()
        return "entered"

    def leave(self, task: Task) -> None:
        self._place(task).give()
        self.slots[task.priority].give()

    def _place(self, task: Task) -> HandlerPlaces:
        # A handler registered after the start (not on the card either) gets one place.
        return self.places.setdefault(task.topic, HandlerPlaces(1))

    async def _take(self, place: HandlerPlaces, priority: Priority, within_s: float) -> Entry:
        """Wait for a place unless the agent begins to stop or ``within_s`` passes first; a
        place handed over as the wait is given up (the agent stopping, the waiting task
        cancelled, its time out) passes on."""
        taking = asyncio.ensure_future(place.take(priority))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait(
                [taking, stopping], timeout=max(0.0, within_s), return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            _give_up(taking, place)
            raise
        finally:
            stopping.cancel()
        if self._stopping.is_set():
            _give_up(taking, place)
            return "stopping"
        if not taking.done():
            _give_up(taking, place)
            return "expired"
        return "entered"


def _give_up(taking: asyncio.Future[None], place: HandlerPlaces) -> None:
    if taking.done() and not taking.cancelled():
        place.give()
    else:
        taking.cancel()  # its own handler passes on a place handed to it meanwhile


class LatencyEstimate:
    """A moving average of handler latency."""

    def __init__(self, weight: float = 0.2) -> None:
        self._weight = weight
        self._average: float | None = None

    @property
    def estimate_ms(self) -> int:
        return int(self._average or 0)

    def observe(self, duration_ms: int) -> None:
        if self._average is None:
            self._average = float(duration_ms)
        else:
            self._average += self._weight * (duration_ms - self._average)


class Latencies:
    """The moving averages of handler latency an agent advertises: one per topic, for the
    capacity of an ``ack`` (a caller of a 5 ms topic is not told the average of the 5 s one
    beside it), and one of every run, for the load of a heartbeat."""

    def __init__(self, weight: float = 0.2) -> None:
        self._weight = weight
        self._all = LatencyEstimate(weight)
        self._by_topic: dict[str, LatencyEstimate] = {}

    @property
    def estimate_ms(self) -> int:
        """Of every run, whatever its topic; 0 before the first."""
        return self._all.estimate_ms

    def of(self, topic: str) -> int:
        """Of the runs of ``topic``'s handler; 0 before its first."""
        estimate = self._by_topic.get(topic)
        return estimate.estimate_ms if estimate is not None else 0

    def observe(self, topic: str, duration_ms: int) -> None:
        self._all.observe(duration_ms)
        self._by_topic.setdefault(topic, LatencyEstimate(self._weight)).observe(duration_ms)
