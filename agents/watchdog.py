"""A thread that notices when the agent's event loop stops turning, and says what holds it.

A stalled loop writes no heartbeat and answers no ping, so the coordinator will soon
call the agent SUSPECT; the watchdog's log line with the loop thread's stack tells
the agent's author why. When the watchdog's own thread stood still as long, the whole
process was stopped, and it says that instead.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback

from agentreach.logs import get_logger

log = get_logger("agents.watchdog")


class Watchdog:
    """A thread that notices when the event loop stops turning, and says what holds it.

    A task on the loop stamps a monotonic time every ``tick``; the thread warns
    "heartbeat lag detected" with the loop thread's stack once the stamp is
    older than ``threshold_s``.
    """

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self._tick_s = max(0.01, threshold_s / 4)
        self._stamp = time.monotonic()
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="reach-watchdog", daemon=True)
        self.lags_detected = 0

    async def run(self) -> None:
        self._loop_thread = threading.get_ident()
        self._thread.start()
        try:
            while True:
                self._stamp = time.monotonic()
                await asyncio.sleep(self._tick_s)
        finally:
            self._stop.set()

    def _watch(self) -> None:
        stalled = False
        woke = time.monotonic()
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            slept_s, woke = now - woke, now
            if slept_s > self.threshold_s:
                # This thread did not run either: the whole process was stopped (SIGSTOP, a
                # paused VM). Said whether or not the loop stamped first once both resumed;
                # its stack would blame whatever ran last.
                self.lags_detected += 1
                log.warning(
                    "heartbeat lag: the whole process was stopped", stopped_s=round(slept_s, 3)
                )
                stalled = True
                continue
            lag = now - self._stamp
            if lag > self.threshold_s and not stalled:
                stalled = True
                self.lags_detected += 1
                frame = sys._current_frames().get(self._loop_thread)
                stack = "".join(traceback.format_stack(frame)) if frame else "(no stack)"
                log.warning("heartbeat lag detected", lag_s=round(lag, 3), stack=stack)
            elif lag <= self.threshold_s:
                stalled = False
