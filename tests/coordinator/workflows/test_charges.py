"""A caller's signals and cancels charged to its quota: what a delivery seen before comes to
(tests/agents/test_workflow_control.py has the first delivery, as a caller meets it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from agentreach.agents import ReachClient, WorkflowActionRefused
from agentreach.broker import Broker, Delivery
from agentreach.coordinator import RateLimits
from agentreach.coordinator.protection.quotas import CallerQuotas
from agentreach.coordinator.workflows.charges import ControlCharges
from agentreach.envelopes import RateLimit, WorkflowRecord
from tests.agents.test_workflow_control import approval_waiting


@dataclass(frozen=True)
class Again:
    """What the charge reads of a delivery: that it came before, and where it is stored."""

    stream_seq: int
    num_delivered: int = 2


def charges(broker: Broker, limits: RateLimits) -> ControlCharges:
    async def records() -> Any:
        return await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)

    return ControlCharges(broker, CallerQuotas(broker, limits), records)


async def test_a_refused_signal_delivered_again_stays_refused(broker):
    """Refused for its caller's quota and delivered again (the coordinator gone after its
    answer, before the acknowledgement), a signal was acted on: its caller, told it was
    not, sends it again, and the machine takes it twice. It stays refused; another signal
    delivered again, or one of a caller with no quota, is not."""
    quota = RateLimits(callers={"alice": RateLimit(rate=0.05, burst=2)})
    async with (
        ReachClient(broker=broker, name="alice") as alice,
        approval_waiting(broker, alice, rate_limits=quota) as (instance, _),
    ):
        await alice.signal_workflow(instance, "nope")  # the second token
        with pytest.raises(WorkflowActionRefused):
            await alice.signal_workflow(instance, "approve")
        [refusal] = [e for e in await alice.status(instance) if e.detail.get("error")]
        seq = refusal.detail["signal_seq"]

        charge = charges(broker, quota)
        assert await charge.refused("signal", f"{instance}.approve.alice", _again(seq))
        assert not await charge.refused("signal", f"{instance}.approve.alice", _again(seq + 1))
        assert not await charge.refused("signal", f"{instance}.approve.bob", _again(seq))
        assert not await charge.refused("signal", f"{instance}.approve", _again(seq))  # operator


def _again(seq: int) -> Delivery:
    return cast(Delivery, Again(seq))
