"""A caller sends only the priorities its credentials allow, on a secured server.

The parties are real: a nats-server with decentralized JWT auth (``reach auth``), a
coordinator with its service identity and seal key, an agent serving ``summarize`` through
the SDK with its own creds, and callers with theirs. ``bulk`` is a caller issued the way a
new caller is (P1 and P2); ``pager`` was given P0 too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentreach import Agent, ReachClient, Rejected, TaskContext
from agentreach.broker import Broker, read_stream
from agentreach.coordinator import Coordinator
from agentreach.envelopes import DeadLetter, decode_as
from tests.cli.conftest import VENV_BIN, run
from tests.secured import SecuredDeployment, sealed_deployment
from tests.support import eventually

AGENT, BULK, PAGER = "summarizer-1", "bulk", "pager"


@dataclass
class Deployment:
    deployment: SecuredDeployment
    url: str
    admin: Broker
    coordinator: Coordinator
    seen: list[tuple[str, Any]] = field(default_factory=list)  # (priority, payload) run

    def caller(self, name: str) -> ReachClient:
        return ReachClient(self.url, name=name, auth=self.deployment.auth("caller", name))


@contextlib.asynccontextmanager
async def secured(tmp_path: Path) -> AsyncIterator[Deployment]:
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", AGENT, intents=("summarize",))
    deployment.directory.issue("caller", BULK)
    deployment.directory.issue("caller", PAGER, priorities=("P0", "P1", "P2"))
    seen: list[tuple[str, Any]] = []
    agent = Agent(AGENT, startup_delay=0)

    @agent.handler("summarize")
    async def summarize(ctx: TaskContext, payload: Any) -> Any:
        seen.append((ctx.envelope.priority, payload))
        return {"by": AGENT, "priority": ctx.envelope.priority}

    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        agent.running(url, auth=deployment.auth("agent", AGENT)),
    ):
        await eventually(lambda: AGENT in coordinator.directory.cards, timeout=10)
        yield Deployment(deployment, url, admin, coordinator, seen)


async def _dead_letters(admin: Broker, topic: str) -> list[DeadLetter]:
    subject = admin.names.dlq("rejected", topic)
    stored = await read_stream(admin, admin.names.dlq_stream, subject)
    return [decode_as(m.data, DeadLetter) for m in stored]


async def test_a_caller_without_p0_is_refused_its_p0_task_and_told_how_to_get_it(tmp_path):
    """bulk's P0 task raises Rejected (priority_not_allowed, not retryable, naming bulk, P0
    and the commands that allow it), runs nowhere and is dead-lettered `rejected`; its P1
    task runs."""
    async with secured(tmp_path) as fleet, fleet.caller(BULK) as bulk:
        with pytest.raises(Rejected) as refused:
            await bulk.invoke("summarize", {"n": 0}, priority="P0")
        error = refused.value.error
        assert refused.value.reason == "priority_not_allowed"
        assert refused.value.ending == "rejected"
        assert error.retryable is False
        assert "caller 'bulk' may not send P0 tasks (it may use P1,P2)" in error.message
        assert "reach auth allow bulk --priorities P0,P1,P2" in error.message
        assert "reach auth push" in error.message
        letters = await _dead_letters(fleet.admin, "summarize")
        assert [(d.message_id, d.error.type) for d in letters if d.error] == [
            (refused.value.message_id, "priority_not_allowed")
        ]
        assert letters[0].envelope is not None and letters[0].envelope.caller == BULK
        assert await bulk.invoke("summarize", {"n": 1}, priority="P1") == {
            "by": AGENT,
            "priority": "P1",
        }
        assert fleet.seen == [("P1", {"n": 1})]


async def test_a_caller_allowed_p0_has_its_p0_task_run_at_p0(tmp_path):
    """pager, issued with --priorities P0,P1,P2, gets its P0 task served from the P0 lane."""
    async with secured(tmp_path) as fleet, fleet.caller(PAGER) as pager:
        result = await pager.invoke("summarize", {"page": "oncall"}, priority="P0")
        assert result == {"by": AGENT, "priority": "P0"}
        assert fleet.seen == [("P0", {"page": "oncall"})]
        assert await _dead_letters(fleet.admin, "summarize") == []


async def test_reach_auth_allow_and_push_give_a_running_deployment_p0(tmp_path):
    """`reach auth allow bulk --priorities P0,P1,P2` and `reach auth push` write what the
    running coordinator enforces: bulk's P0 task then runs, without a restart; narrowed
    again, it is refused again."""
    async with secured(tmp_path) as fleet, fleet.caller(BULK) as bulk:
        root = fleet.deployment.directory.root
        reach = VENV_BIN / "reach"
        allowed = await run(reach, "auth", "allow", BULK, "--priorities", "p0,P1,P2", "--dir", root)
        assert allowed.returncode == 0, allowed.stderr
        assert "bulk may send: P0,P1,P2" in allowed.stdout
        pushed = await run(reach, "auth", "push", "--nats-url", fleet.url, "--dir", root)
        assert pushed.returncode == 0, pushed.stderr
        assert "priorities.bulk: P0,P1,P2" in pushed.stdout
        priorities = fleet.coordinator.directory.priorities
        await eventually(lambda: "P0" in priorities.of(BULK), timeout=10)
        assert await bulk.invoke("summarize", {"n": 2}, priority="P0") == {
            "by": AGENT,
            "priority": "P0",
        }
        narrowed = await run(reach, "auth", "allow", BULK, "--priorities", "P2", "--dir", root)
        assert narrowed.returncode == 0, narrowed.stderr
        await run(reach, "auth", "push", "--nats-url", fleet.url, "--dir", root)
        await eventually(lambda: priorities.of(BULK) == ("P2",), timeout=10)
        with pytest.raises(Rejected, match="it may use P2"):
            await bulk.invoke("summarize", {"n": 3}, priority="P1")
        assert fleet.seen == [("P0", {"n": 2})]


async def test_a_caller_issued_since_the_last_push_may_send_p1_and_p2_only(tmp_path):
    """A caller the bucket does not name yet (issued after the push, which a caller needs
    no more than creds) has the new caller's priorities: P1 runs, P0 is refused."""
    async with secured(tmp_path) as fleet, fleet.caller("newcomer") as newcomer:
        assert (await newcomer.invoke("summarize", {}, priority="P2"))["priority"] == "P2"
        with pytest.raises(Rejected, match="caller 'newcomer' may not send P0"):
            await newcomer.invoke("summarize", {}, priority="P0")
