"""The coordinator's control messages to one agent on ``reach.ctl.agent.<id>`` (protocol §8)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError
from agentreach.envelopes import AgentControl
from agentreach.envelopes.server_answers import CONTROL_HEADERS

REFUSALS_TOLD = 10  # of the intents refused, named in one control message


async def tell(broker: Broker, agent_id: str, control: AgentControl) -> None:
    """Core publish, not stored: an agent not listening has nothing to catch up on."""
    with contextlib.suppress(BrokerError):
        await broker.publish_core(  # with a header: one without is nobody's
            broker.names.agent_control(agent_id),
            envelopes.encode(control),
            headers=CONTROL_HEADERS,
        )


async def tell_refused(broker: Broker, agent_id: str, refusals: Mapping[str, str]) -> None:
    """Tell an agent which intents of its card it is routed no task of, and why: only the
    coordinator's log and an alert said so, and the agent waited for work that never came."""
    if not refusals:
        return
    named = dict(sorted(refusals.items())[:REFUSALS_TOLD])
    await tell(broker, agent_id, AgentControl(refused=named, refused_count=len(refusals)))
