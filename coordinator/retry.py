"""When to try a failed task again: exponential backoff with jitter, capped."""

from __future__ import annotations

import random

JITTER = 0.2


def backoff_s(
    attempt: int, *, base_s: float, cap_s: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after attempt ``attempt`` failed: base · 2^(attempt-1), ±20 %, ≤ cap."""
    exponential = base_s * 2 ** (attempt - 1)
    jitter = 1 + (rng or random).uniform(-JITTER, JITTER)
    return min(cap_s, exponential * jitter)
