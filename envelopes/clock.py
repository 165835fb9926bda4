"""Time as the wire counts it: milliseconds since the epoch, and what is left of a ttl.

Expiry is judged on the clock of the process that judges (a coordinator or an agent)
against the broker's time of storing a message, never against a sender's clock.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """This process's wall clock in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def ttl_left_ms(ttl_ms: int, since_ms: int, now: int | None = None) -> int:
    """What is left of ``ttl_ms`` counted from ``since_ms`` (negative once it has passed).

    A ``since_ms`` in the future (clocks apart) counts as now: a ttl never grows.
    """
    elapsed = (now_ms() if now is None else now) - since_ms
    return ttl_ms - max(0, elapsed)


def ttl_passed_in_queue(
    ttl_ms: int, agent_id: str, *, dispatched_ms: int, received_ms: int, delivered: int = 1
) -> str:
    """Why a queued dispatch expired. A dispatch's ttl is what was left of it when it was
    routed: one routed late says so (a letter read "ttl 2048 ms" of a task sent with
    90,000 ms that had waited 88 s in intake). One ``delivered`` before did not only wait:
    its earlier deliveries' processes died or stalled (it read "passed in the queue" of a
    task that had crashed the agent three times)."""
    if delivered > 1:
        return (
            f"ttl {ttl_ms} ms ran out with {agent_id}: delivered {delivered} times, and no"
            " run of it finished (each process that took it died or stalled)"
        )
    waited_ms = dispatched_ms - received_ms
    if received_ms and waited_ms >= 1000:
        return (
            f"its ttl passed in the queue of {agent_id} ({ttl_ms} ms of it were left when it"
            f" was dispatched there, {waited_ms / 1000:.1f} s after it was taken in)"
        )
    return f"ttl {ttl_ms} ms passed in the queue of {agent_id}"
