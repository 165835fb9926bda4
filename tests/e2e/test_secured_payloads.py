"""Large payloads on a secured deployment (`reach auth`, a coordinator with its service
identity and seal key, each party with creds of its own): no party may use the Object Store,
so what is above the claim-check threshold travels inline up to the server's max_payload,
and what cannot travel ends in a dead letter that says why, at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from agentreach.agents import Agent, ReachClient, TaskContext, TaskFailed
from agentreach.broker import (
    Broker,
    ClaimCheck,
    PayloadUnavailable,
    TooLarge,
)
from agentreach.envelopes import PayloadRef
from agentreach.envelopes import headers as h
from tests.secured import SecuredDeployment, sealed_deployment
from tests.support import Watcher

pytestmark = pytest.mark.asyncio(loop_scope="module")

AGENT, CALLER = "mirror-1", "carol"
# What the red team sent: 1,000,012 bytes, above the 256 KiB threshold, under 1 MiB.
PUB_BODY = msgspec.json.encode({"text": "x" * 1_000_000})


@dataclass
class Deployment:
    admin: Broker
    caller: Broker  # carol's raw connection: `nats pub` with her creds
    client: ReachClient  # carol through the SDK
    watcher: Watcher
    seen: list[int]  # lengths of the texts the agent ran


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def deployment(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    root = tmp_path_factory.mktemp("secured-payloads")
    auth = SecuredDeployment(root / "auth")
    auth.directory.issue("agent", AGENT, intents=("mirror", "inflate"))
    seen: list[int] = []
    agent = Agent(AGENT, startup_delay=0)

    @agent.handler("mirror", capacity=4)
    async def mirror(ctx: TaskContext, payload: Any) -> Any:
        seen.append(len(payload["text"]))
        return {"length": len(payload["text"])}

    @agent.handler("inflate")
    async def inflate(ctx: TaskContext, payload: Any) -> Any:
        seen.append(-1)
        return {"text": "r" * 400_000}  # above the threshold: no claim check to take it

    async with (
        sealed_deployment(auth, root / "server") as (url, admin, _),
        Watcher(admin) as watcher,
        agent.running(url, auth=auth.auth("agent", AGENT)),
        Broker(url, name=CALLER, auth=auth.auth("caller", CALLER)) as caller,
        ReachClient(url, name=CALLER, auth=auth.auth("caller", CALLER)) as client,
    ):
        yield Deployment(admin, caller, client, watcher, seen)


async def test_a_large_nats_pub_body_completes(deployment: Deployment) -> None:
    """A 1,000,012-byte body published by a caller runs once and completes: it travels
    inline to the agent, nothing is stowed, nothing is redelivered."""
    d = deployment
    subject = d.admin.names.task("mirror", CALLER)
    await d.caller.publish(subject, PUB_BODY, headers={h.MSG_ID: "big-pub-1"})
    completed = await d.watcher.event("completed", message_id="big-pub-1", timeout=20)
    assert completed.detail["result"] == {"length": 1_000_000}
    routed = await d.watcher.event("routed", message_id="big-pub-1")
    assert routed.detail["input"].get("ref") is None  # inline: nothing was stowed
    assert d.watcher.count("routed", {"big-pub-1"}) == 1


async def test_a_large_invoke_payload_completes(deployment: Deployment) -> None:
    """A caller's 600 KB payload through ``ReachClient.invoke`` is answered: the SDK sends
    it inline instead of putting it in the Object Store it may not write."""
    result = await deployment.client.invoke(
        "mirror", {"text": "y" * 600_000}, execute_deadline_ms=15_000
    )
    assert result == {"length": 600_000}


async def test_a_body_too_large_to_carry_is_dead_lettered_at_once(deployment: Deployment) -> None:
    """A body that fits the server but not inline with its envelope is dead-lettered on its
    first delivery, with the reason, instead of being redelivered for ever."""
    d = deployment
    limit = d.caller.max_payload
    body = msgspec.json.encode({"text": "z" * (limit - 1024)})
    assert len(body) <= limit
    subject = d.admin.names.task("mirror", CALLER)
    await d.caller.publish(subject, body, headers={h.MSG_ID: "too-big-1"})
    letter = await d.watcher.dead_letter("rejected", message_id="too-big-1", timeout=20)
    assert letter.error is not None and letter.error.type == "claim_check_failed"
    assert "secured deployment has no claim check" in letter.error.message
    assert letter.truncated  # the payload is not kept whole beside the reason
    assert d.watcher.count("routed", {"too-big-1"}) == 0


async def test_the_sdk_refuses_what_cannot_travel(deployment: Deployment) -> None:
    """The caller's SDK says at once, naming the limit, when a payload is above what a
    secured deployment carries."""
    with pytest.raises(TooLarge, match="secured deployment has no claim check"):
        await deployment.client.invoke("mirror", {"text": "w" * 2_000_000})


async def test_no_party_reads_the_payload_store(deployment: Deployment) -> None:
    """A party's read of a claim-checked reference fails at once with a clear error (the
    store's subjects cannot be scoped to one party), not after a timeout."""
    ref = PayloadRef(bucket="reach_payloads", name="x/payload", size=1, sha256="0" * 64)
    with pytest.raises(PayloadUnavailable, match="caller of a secured deployment may not"):
        await ClaimCheck(deployment.caller).get(ref)


async def test_a_result_too_large_to_record_fails_once_not_retried(
    deployment: Deployment,
) -> None:
    """A handler's 400 KB result cannot be claim-checked on a secured deployment: the task
    fails once as result_too_large (not retryable), instead of running again per attempt."""
    before = deployment.seen.count(-1)
    with pytest.raises(TaskFailed) as failed:
        await deployment.client.invoke("inflate", {})
    assert failed.value.error.type == "result_too_large"
    assert failed.value.error.retryable is False
    assert deployment.seen.count(-1) == before + 1
