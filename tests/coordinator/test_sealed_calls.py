"""Calls through a coordinator with its seal key (a real secured deployment): the task it
publishes for a caller keeps the caller's id, as the caller's own publish would."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker
from agentreach.envelopes import headers as h
from tests.secured import SecuredDeployment, sealed_deployment


def upper() -> Agent:
    agent = Agent("sealed-upper", startup_delay=0)

    @agent.handler("upper")
    async def shout(ctx: TaskContext, payload: dict) -> dict:
        return {"text": payload["text"].upper()}

    return agent


async def test_a_caller_s_calls_on_a_sealed_deployment_keep_its_ids(tmp_path: Path):
    """A full envelope is taken (its id was sealed into a header that no longer matched its
    body: `invalid_envelope`); the same call sent again is answered at once from the first
    one's end (it waited for the whole ttl); `Reach-Message-Id` is the id the task is
    recorded under, whose events the caller can read."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "sealed-upper", intents=("upper",))
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, _admin, _),
        upper().running(url, auth=deployment.auth("agent", "sealed-upper")),
        Broker(url, name="carol", auth=deployment.auth("caller", "carol")) as carol,
        ReachClient(url, name="carol", auth=deployment.auth("caller", "carol")) as client,
    ):
        subject = carol.names.call("upper", "carol")
        message_id = envelopes.new_id()
        task = envelopes.Task(
            v=1, message_id=message_id, trace_id=message_id, topic="upper", payload={"text": "env"}
        )
        answer = await carol.nc.request(subject, envelopes.encode(task), timeout=10)
        assert envelopes.decode_json(answer.data) == {"text": "ENV"}, answer.data
        assert answer.headers is not None and answer.headers[h.MESSAGE_ID] == message_id

        again = {h.MSG_ID: "bare-call-1", h.TTL: "20000"}
        first = await carol.nc.request(subject, b'{"text": "one"}', timeout=10, headers=again)
        assert first.headers is not None and first.headers[h.MESSAGE_ID] == "bare-call-1"
        second = await asyncio.wait_for(
            carol.nc.request(subject, b'{"text": "one"}', timeout=10, headers=again), 5
        )
        assert envelopes.decode_json(second.data) == {"text": "ONE"}, second.data
        events = await client.status("bare-call-1")
        assert [e.event for e in events if e.event in ("routed", "completed")] == [
            "routed",
            "completed",
        ]
