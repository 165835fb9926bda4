"""``reach agents forget ID``: retire an agent that is gone for good.

A killed agent's card, its last heartbeat (with the load it had) and the coordinator's
OFFLINE verdict stay in KV: they are what an operator needs to see that it died and why.
Nothing removes them by itself, on purpose: the coordinator cannot tell an agent retired
for good from one that crashed and must be started again, and deleting the records of the
second after some hours would hide it. An operator who knows says so with this command.
"""

from __future__ import annotations

from agentreach.broker import Broker, WrongLastSequence
from agentreach.broker.presence import present
from agentreach.cli.options import UsageError
from agentreach.envelopes import AgentCard, Heartbeat, Liveness

PRESENCE_S = 3.0  # the coordinator's own probe timeout for a connection


async def forget(broker: Broker, agent_id: str) -> str:
    """Delete the card, heartbeat and liveness verdict of an OFFLINE or stopped agent whose
    connection is gone; refuse (UsageError) anything that may still run. Returns what was
    forgotten, for the operator."""
    names = broker.names
    cards = await broker.bucket(names.agents_bucket, AgentCard)
    beats = await broker.bucket(names.heartbeats_bucket, Heartbeat)
    verdicts = await broker.bucket(names.liveness_bucket, Liveness)
    card, beat = await cards.get(agent_id), await beats.get(agent_id)
    judged = await verdicts.get(agent_id)
    if card is None and beat is None and judged is None:
        raise UsageError(f"{agent_id}: unknown agent")
    stopped = card is not None and card.value.status != "running"
    state = "STOPPED" if stopped else judged.value.state if judged else "UNKNOWN"
    newer = card is not None and judged is not None and card.value.epoch > judged.value.epoch
    if state not in ("STOPPED", "OFFLINE") or (newer and not stopped):
        raise UsageError(
            f"{agent_id} is {'a new process, not judged yet' if newer else state}: only an"
            " OFFLINE or STOPPED agent can be forgotten (stop it first, or wait until the"
            " coordinator judges it OFFLINE)"
        )
    if await present(broker, agent_id, timeout_s=PRESENCE_S) is not False:
        raise UsageError(
            f"{agent_id} is {state}, but a connection of it is on the server still: stop its"
            " process first"
        )
    if card is not None:
        try:  # only the card read above: a process that registered since keeps its own
            await cards.delete(agent_id, last=card.revision)
        except WrongLastSequence:
            raise UsageError(f"{agent_id} registered again just now; not forgotten") from None
    await beats.delete(agent_id)
    await verdicts.delete(agent_id)
    return f"{agent_id}: forgotten (was {state}): its card, heartbeat and liveness are deleted"
