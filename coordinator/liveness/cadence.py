"""Adaptive heartbeat intervals: closer watch after a scare, a lighter touch when idle.

After a SUSPECT episode the agent beats at half its base interval until it has
been healthy for ``adaptive_beats`` beats; an agent idle for that many beats
beats at twice its base. Thresholds follow, because each heartbeat carries the
interval it was sent under.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentreach.envelopes.registry import MAX_HEARTBEAT_INTERVAL_S

TIGHTEN = 0.5
LOOSEN = 2.0


@dataclass
class Cadence:
    """The interval policy for one agent; ``next`` says when to send a new interval."""

    base_s: float
    beats_needed: int
    tightened: bool = False
    loosened: bool = False
    healthy: int = 0
    idle: int = 0

    def after_recovery(self) -> float:
        self.tightened, self.loosened, self.healthy = True, False, 0
        return self.base_s * TIGHTEN

    def on_beat(self, in_flight: int) -> float | None:
        """The interval to ask for after this heartbeat, or None to leave it."""
        self.healthy += 1
        self.idle = self.idle + 1 if in_flight == 0 else 0
        if self.tightened:
            if self.healthy < self.beats_needed:
                return None
            self.tightened = False
            return self.base_s
        if self.loosened and self.idle == 0:
            self.loosened = False
            return self.base_s
        if not self.loosened and self.idle >= self.beats_needed:
            self.loosened = True
            return min(self.base_s * LOOSEN, MAX_HEARTBEAT_INTERVAL_S)
        return None
