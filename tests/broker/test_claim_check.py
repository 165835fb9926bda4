"""Claim checks read back on a real server: only from the bucket they are kept in."""

from __future__ import annotations

import pytest

from agentreach.broker import ClaimCheck
from agentreach.broker.claim_check import PayloadUnavailable
from agentreach.envelopes import PayloadRef


async def test_a_reference_to_another_bucket_is_refused_naming_the_right_one(broker):
    """A red team's `payload_ref` named the agents' KV bucket and was told the object was
    "no longer stored": it never was a payload, and no sender's reference is read from just
    any bucket."""
    ref = PayloadRef(bucket="KV_reach_agents", name="good-1", size=1, sha256="0" * 64)
    with pytest.raises(PayloadUnavailable) as refused:
        await ClaimCheck(broker).get(ref)
    kept_in = broker.names.payloads_bucket
    assert str(refused.value) == (
        f"KV_reach_agents/good-1: claim checks are kept in the Object Store bucket {kept_in},"
        " not KV_reach_agents"
    )
