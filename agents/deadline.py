"""How long a handler may run: its intent's deadline, restarted by each progress report, and
never past the task's execute budget.

The intent's ``deadline_ms`` is how long a handler may work without saying so; a handler
that reports progress (``ctx.progress()``) gets that long again from then on. The task's
``budget.execute_ms`` is the sender's limit, counted from the start: nothing extends it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

LEASE_GRACE_MS = 1_000  # time to record the outcome after the deadline


class Deadline:
    """The moment a handler's time ends, on the event loop's (monotonic) clock."""

    def __init__(self, *, budget_ms: int, window_ms: int | None) -> None:
        self._loop = asyncio.get_running_loop()
        self.started = self._loop.time()
        self.budget_ms = budget_ms
        self.window_ms = min(window_ms or budget_ms, budget_ms)
        self._ends = self.started + self.window_ms / 1000
        self._scope: asyncio.Timeout | None = None
        self._held = 0  # progress reports under way (see held)
        self.overrun = False  # work that cannot be stopped ran on past it (see handlers)

    @property
    def ends(self) -> float:
        return self._ends

    @property
    def total_ms(self) -> int:
        """The deadline as milliseconds after the start (it grows with progress)."""
        return round((self._ends - self.started) * 1000)

    def left_ms(self) -> int:
        """Milliseconds left (never negative)."""
        return max(0, round((self._ends - self._loop.time()) * 1000))

    def enforce(self, scope: asyncio.Timeout) -> None:
        """Cancel the handler through ``scope`` when the deadline passes (and follow it when
        progress moves it)."""
        self._scope = scope
        scope.reschedule(self._ends)

    def extend(self) -> bool:
        """Progress: the window starts again, within the budget. True when it moved."""
        ends = min(self._loop.time() + self.window_ms / 1000, self.started + self.budget_ms / 1000)
        if ends <= self._ends:
            return False
        self._ends = ends
        if not self._held:
            self._reschedule(ends)
        return True

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While the block runs (a progress report and its claim renewal), the deadline does
        not pass, only the budget's end: the handler waits on the report there, not on its
        own work, and a server slow to take it (away for a moment) must not cost the handler
        its deadline, nor run its work again. The window starts again at each end."""
        self.extend()
        self._held += 1
        self._reschedule(self.started + self.budget_ms / 1000)
        try:
            yield
        finally:
            self._held -= 1
            self.extend()
            if not self._held:
                self._reschedule(self._ends)

    def _reschedule(self, when: float) -> None:
        if self._scope is not None and not self._scope.expired():
            self._scope.reschedule(when)

    def lease_ms(self) -> int:
        """How long a claim must last from now to outlive this deadline and the recording."""
        return self.left_ms() + LEASE_GRACE_MS
