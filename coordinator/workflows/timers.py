"""A timer comes after what happened before it was due.

An instance's replies, signals and timers wait in ``REACH_WORKFLOWS`` together. After an
outage (no coordinator ran) they are delivered again, and a timer armed long before can come
first: a step would time out, or a state's wait pass, though the reply or the signal that
ended it was stored in time. So a timer whose instance has a reply or a signal stored before
it was due waits a moment for that message to be handled first, for at most
``NEWS_WAIT_MS`` past its due time (a message that is never handled must not hold it).
"""

from __future__ import annotations

from agentreach.broker import Broker
from agentreach.broker.direct import messages_on

LATER_S = 0.2  # how soon a timer that waits for earlier news comes back
NEWS_WAIT_MS = 30_000


async def news_before(broker: Broker, instance_id: str, due_ms: int, now_ms: int) -> bool:
    """Whether a reply or a signal of the instance stored by ``due_ms`` is still to be
    handled (and the timer may still wait for it)."""
    if now_ms - due_ms > NEWS_WAIT_MS:
        return False
    names = broker.names
    # Each reply names its sender last (``reach.wf.reply.<instance>.<sender>``).
    replies = names.workflow_reply(instance_id) + ".>"
    for subject in (replies, names.workflow_signal(instance_id, ">")):
        oldest = await messages_on(broker, names.workflows_stream, subject, limit=1)
        if oldest and oldest[0].timestamp_ms <= due_ms:
            return True
    return False
