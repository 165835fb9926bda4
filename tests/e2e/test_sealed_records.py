"""On a secured deployment the coordinator believes an agent's execution record only when it
carries the seal of an attempt the coordinator gave that agent: no agent can answer another
caller's message with a result of its own, nor hold a message with a lease, by writing a
record under its own key (which its permissions allow)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, read_stream
from agentreach.coordinator.protection.grants import Grants, SecurityConfig
from agentreach.coordinator.routing.run_once import RanAlready, RunOnce
from agentreach.envelopes import Execution, Task, decode_event, execution_key, now_ms
from tests.secured import SecuredDeployment, sealed_deployment

DAY_MS = 86_400_000


@dataclass
class Deployed:
    admin: Broker
    evil: Broker  # an agent with creds of its own, serving nothing
    alice: ReachClient
    grants: Grants
    runs: list[str]

    async def forge(self, message_id: str, **fields: Any) -> None:
        """Evil's record of alice's ``message_id``, under its own key."""
        bucket = await self.evil.bucket(self.evil.names.executions_bucket, Execution)
        record = Execution(message_id=message_id, agent_id="evil", caller="alice", **fields)
        await bucket.put(execution_key("alice", message_id, "evil"), record)


@pytest.fixture
async def deployed(tmp_path: Path) -> AsyncIterator[Deployed]:
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "honest-1", intents=("pay",))
    runs: list[str] = []
    honest = Agent("honest-1", startup_delay=0)

    @honest.handler("pay")
    async def pay(ctx: TaskContext, payload: Any) -> dict[str, bool]:
        runs.append(ctx.message_id)
        return {"paid": True}

    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, _),
        honest.running(url, auth=deployment.auth("agent", "honest-1")),
        Broker(url, name="evil", auth=deployment.auth("agent", "evil")) as evil,
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
    ):
        grants = Grants.from_config(SecurityConfig(seal_key_file=deployment.seal_key_file))
        yield Deployed(admin, evil, alice, grants, runs)


async def test_a_result_an_agent_wrote_for_a_message_it_was_not_given_is_not_believed(
    deployed: Deployed,
) -> None:
    """Evil writes `done` with its own result for the id alice is about to use: alice gets
    the real agent's result, and the message runs there."""
    await deployed.forge("pay-1", state="done", result={"FORGED": True}, finished_at_ms=now_ms())
    assert await deployed.alice.invoke("pay", {}, message_id="pay-1") == {"paid": True}
    assert deployed.runs == ["pay-1"]


async def test_a_lease_an_agent_wrote_for_a_message_it_was_not_given_holds_nothing(
    deployed: Deployed,
) -> None:
    """Evil writes a `running` record with a day's lease for alice's next id: the message is
    routed and runs at once instead of waiting a day (and holding a place in intake)."""
    await deployed.forge("pay-2", state="running", lease_until_ms=now_ms() + DAY_MS)
    assert await deployed.alice.invoke("pay", {}, message_id="pay-2", ttl_ms=10_000) == {
        "paid": True
    }
    assert deployed.runs == ["pay-2"]


async def test_the_record_of_the_agent_given_the_attempt_is_believed(deployed: Deployed) -> None:
    """The honest agent's record carries the dispatch's seal: the coordinator's run-once
    look finds that the message ran (and would answer from it), and finds nothing in a
    forged one."""
    assert await deployed.alice.invoke("pay", {}, message_id="pay-3") == {"paid": True}
    await deployed.forge("pay-4", state="done", result={"FORGED": True}, finished_at_ms=now_ms())
    run_once = RunOnce(deployed.admin, deployed.grants)
    ran = await run_once.verdict(
        Task(v=1, message_id="pay-3", trace_id="pay-3", topic="pay", caller="alice")
    )
    forged = await run_once.verdict(
        Task(v=1, message_id="pay-4", trace_id="pay-4", topic="pay", caller="alice")
    )
    assert isinstance(ran, RanAlready) and ran.record.agent_id == "honest-1"
    assert ran.record.seal is not None
    assert forged is None


async def test_a_forged_record_raises_one_alert_however_often_it_is_looked_at(
    deployed: Deployed,
) -> None:
    """Every look at the message (intake, reassignment, queue expiry; each replica) meets the
    forged record: the events stream records one impersonation alert for it, not one a look."""
    await deployed.forge("pay-5", state="done", result={"FORGED": True}, finished_at_ms=now_ms())
    task = Task(v=1, message_id="pay-5", trace_id="pay-5", topic="pay", caller="alice")
    for _replica in range(2):
        run_once = RunOnce(deployed.admin, deployed.grants)
        for _ in range(3):
            assert await run_once.records(task) == []
    names = deployed.admin.names
    stored = await read_stream(deployed.admin, names.events_stream, names.events_of_kind("alert"))
    alerts = [decode_event(m.data) for m in stored]
    about = [a for a in alerts if a.detail.get("message_id") == "pay-5"]
    assert len(about) == 1, about
    assert about[0].detail["problem"] == "impersonation" and about[0].agent_id == "evil"
    # Written again, the record is news: one more alert.
    await deployed.forge("pay-5", state="running", lease_until_ms=now_ms() + DAY_MS)
    assert await RunOnce(deployed.admin, deployed.grants).records(task) == []
    stored = await read_stream(deployed.admin, names.events_stream, names.events_of_kind("alert"))
    assert sum(decode_event(m.data).detail.get("message_id") == "pay-5" for m in stored) == 2


async def test_many_forged_records_of_one_id_cost_a_few_alerts_a_read(deployed: Deployed) -> None:
    """A task with `replay_of` reads every sender's records of its id: an agent wrote
    thousands under one id (a caller each), and each such task raised an alert and a log
    line for every one of them. One line and the latest five alerts a read now."""
    bucket = await deployed.evil.bucket(deployed.evil.names.executions_bucket, Execution)
    for n in range(40):
        record = Execution(message_id="R0", agent_id="evil", caller=f"k{n}", state="done")
        await bucket.put(execution_key(f"k{n}", "R0", "evil"), record)
    task = Task(v=1, message_id="R0", trace_id="R0", topic="pay", caller="x", replay_of="R")
    with capture_logs() as logs:
        assert await RunOnce(deployed.admin, deployed.grants).records(task) == []
    names = deployed.admin.names
    stored = await read_stream(deployed.admin, names.events_stream, names.events_of_kind("alert"))
    alerts = [decode_event(m.data) for m in stored]
    about = [a for a in alerts if a.detail.get("message_id") == "R0"]
    said = [e for e in logs if e["event"].startswith("record")]
    assert len(about) == 5
    assert [(e["event"], e["count"]) for e in said] == [("records not believed", 40)]
