"""The coordinator's desks under a flood, against a real nats-server."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, BrokerError
from agentreach.coordinator import Coordinator, desks
from tests.conftest import FAST, coordinator_auth
from tests.secured import SECURED
from tests.support import until_true

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOOD_S = 5.0


async def flooded(
    url: str,
    subject: str,
    request: pytest.FixtureRequest,
    *,
    role: str = "caller",
    name: str = "flooder",
) -> asyncio.Task[int]:
    """A flood of ``subject`` for FLOOD_S, from another process (as the ``role`` ``name``,
    when secured)."""
    env = dict(os.environ)
    if SECURED:
        creds = request.getfixturevalue("deployment").auth(role, name).creds
        env["NATS_CREDS"] = str(creds)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.flood", url, subject, str(FLOOD_S), cwd=REPO, env=env
    )
    return asyncio.create_task(proc.wait())


async def test_a_flood_of_status_requests_leaves_the_coordinators_connection_up(broker, request):
    """Any caller may ask `reach.ctl.status`: a flood of it made the server cut the
    coordinator's only connection as a slow consumer, and its leases lapsed (a security
    trial: 10 million requests in 12 s). The desks have a connection of their own: the one
    that holds the leases and consumes the streams stays up, the flooded desk stops
    listening for a while, a task sent during the flood completes, and the desk answers
    again after it."""
    agent = Agent("desk-echo", startup_delay=0)

    @agent.handler("echo")
    async def echo(ctx: TaskContext, payload: dict) -> dict:
        return payload

    auth = coordinator_auth(request)
    async with (
        Broker(broker.url, names=broker.names, name="coordinator", auth=auth) as own,
        Coordinator(own, FAST).running() as coordinator,
        agent.running(broker=broker),
        ReachClient(broker=broker) as client,
    ):
        assert await client.invoke("echo", {"n": 0}) == {"n": 0}
        reconnects, held = own.reconnects, coordinator.status()["duties"]
        with capture_logs() as logs:
            flood = await flooded(broker.url, broker.names.status, request)
            during = await client.invoke("echo", {"n": 1}, ack_deadline_ms=60_000, ttl_ms=120_000)
            assert await flood == 0
            await until_true(lambda: status_answered(broker), timeout=60)  # listening again
        after = await client.invoke("echo", {"n": 2}, ack_deadline_ms=60_000, ttl_ms=120_000)
        assert (during, after) == ({"n": 1}, {"n": 2})
        assert own.reconnects == reconnects  # the coordinator's own connection was not cut
        assert coordinator.status()["duties"] == held == ["liveness", "manual", "queue_expiry"]
    # Reading the flood had starved the whole process for 16-26 s in a re-test: the desk now
    # stops listening, and the server drops the rest.
    flooded_desks = [e["subject"] for e in logs if e["event"].startswith("a desk flooded")]
    assert flooded_desks and set(flooded_desks) == {broker.names.status}


async def status_answered(broker: Broker) -> bool:
    """Whether a coordinator answers `reach.ctl.status` now (no responders: it does not)."""
    try:
        await broker.request(broker.names.status, b"", timeout=1)
    except BrokerError:
        return False
    return True


async def test_an_agent_waits_for_a_flooded_registrations_desk_rather_than_register_alone(
    broker, coordinator, request, monkeypatch
):
    """An agent may flood its registration subject: the desk stops listening for a while, as
    the others do. An agent that starts meanwhile hears no responders there, which meant "no
    coordinator runs: register on your own". It asks `reach.ctl.status` first: a coordinator
    answers, so it waits and registers through the desk once it listens again."""
    # Deaf for 15 s, not 5: a loaded CI run's agent reached its registration after the desk
    # listened again, and never met it deaf.
    monkeypatch.setattr(desks, "COOL_S", 15.0)
    names = broker.names
    latecomer = Agent("desk-latecomer", startup_delay=0)
    latecomer.handler("echo")(_echo)
    with capture_logs() as logs:
        subject = names.register("flooding-agent")
        flood = await flooded(broker.url, subject, request, role="agent", name="flooding-agent")
        await until_true(lambda: _desk_flooded(logs, names.registrations), timeout=30)
        async with latecomer.running(broker=broker):
            assert await flood == 0
            cards = await broker.kv(names.agents_bucket)
            assert (await cards.get("desk-latecomer")) is not None
    said = [entry["event"] for entry in logs]
    # A loaded CI run's status desk answered too late (the flood queued before it): that is
    # no proof that nobody runs, and the agent asks again too.
    waited = {
        "a coordinator runs but its registrations' desk does not listen now",
        "the registrations' desk does not listen and reach.ctl.status did not answer in time;"
        " asking again",
    }
    assert waited & set(said)
    assert "no coordinator answered the registration; registering directly" not in said
    assert "a flooded desk listens again" in said


async def _desk_flooded(logs: list[dict], subject: str) -> bool:
    return any(e["event"].startswith("a desk flooded") and e["subject"] == subject for e in logs)


async def _echo(ctx: TaskContext, payload: dict) -> dict:
    return payload
