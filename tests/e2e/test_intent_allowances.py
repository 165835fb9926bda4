"""An agent serves only the intents its credentials allow, on a secured server.

The parties are real: a nats-server with decentralized JWT auth (``reach auth``), a
coordinator with its service identity and seal key, agents serving through the SDK with
their own creds, a caller. ``summarizer-1`` may serve ``summarize``; ``evil`` may serve
``translate`` only, but its card declares ``summarize`` too, with a far larger capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, BrokerError, read_stream
from agentreach.cli.auth import push_allowances
from agentreach.coordinator import Coordinator
from agentreach.coordinator.protection.grants import SecurityConfig
from agentreach.coordinator.routing.allowances import Allowance, bucket_name
from agentreach.coordinator.routing.directory import REFUSALS_SAID_PER_MINUTE
from agentreach.envelopes import AgentCard, Event, decode_as
from tests.cli.conftest import VENV_BIN, run
from tests.conftest import FAST
from tests.secured import SecuredDeployment, sealed_deployment
from tests.support import eventually, until_true

HONEST, EVIL = "summarizer-1", "evil"
TASKS = 8


@dataclass
class Fleet:
    deployment: SecuredDeployment
    url: str
    admin: Broker
    coordinator: Coordinator
    caller: ReachClient
    seen: dict[str, list[Any]] = field(default_factory=dict)


def _agent(agent_id: str, seen: list[Any], capacities: dict[str, int]) -> Agent:
    agent = Agent(agent_id, startup_delay=0, tags={"role": "worker"})
    for intent, capacity in capacities.items():
        agent.handler(intent, capacity=capacity)(_recording(agent_id, intent, seen))
    return agent


def _recording(agent_id: str, intent: str, seen: list[Any]) -> Any:
    async def handle(ctx: TaskContext, payload: Any) -> Any:
        seen.append((intent, payload))
        return {"by": agent_id}

    return handle


@contextlib.asynccontextmanager
async def secured_fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", HONEST, intents=("summarize",))
    deployment.directory.issue("agent", EVIL, intents=("translate",))
    seen: dict[str, list[Any]] = {HONEST: [], EVIL: []}
    honest = _agent(HONEST, seen[HONEST], {"summarize": 1})
    evil = _agent(EVIL, seen[EVIL], {"summarize": 1000, "translate": 5})
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        honest.running(url, auth=deployment.auth("agent", HONEST)),
        evil.running(url, auth=deployment.auth("agent", EVIL)),
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
    ):
        fleet = Fleet(deployment, url, admin, coordinator, alice, seen)
        await eventually(lambda: EVIL in coordinator.directory.cards, timeout=10)
        await eventually(lambda: HONEST in coordinator.directory.cards, timeout=10)
        yield fleet


async def _invoke_all(fleet: Fleet, intent: str, count: int) -> list[Any]:
    calls = [fleet.caller.invoke(intent, {"n": n}) for n in range(count)]
    async with asyncio.timeout(30):
        return list(await asyncio.gather(*calls))


async def _alerts_about(admin: Broker, agent_id: str) -> list[Event]:
    subject = f"{admin.names.prefix}.event.alert.*.{agent_id}.>"
    stored = await read_stream(admin, admin.names.events_stream, subject)
    return [decode_as(m.data, Event) for m in stored]


async def test_an_agent_gets_none_of_the_tasks_of_an_intent_it_is_not_allowed(tmp_path):
    """evil declares summarize with capacity 1000: every summarize task still goes to the
    agent allowed it, evil's allowed intent still reaches evil, and one alert names it."""
    async with secured_fleet(tmp_path) as fleet:
        results = await _invoke_all(fleet, "summarize", TASKS)
        assert results == [{"by": HONEST}] * TASKS
        assert fleet.seen[EVIL] == []
        assert len(fleet.seen[HONEST]) == TASKS
        assert await _invoke_all(fleet, "translate", 2) == [{"by": EVIL}] * 2
        assert [intent for intent, _ in fleet.seen[EVIL]] == ["translate", "translate"]
        refused = fleet.coordinator.directory.refused
        assert list(refused) == [EVIL] and list(refused[EVIL]) == ["summarize"]
        alerts = await _alerts_about(fleet.admin, EVIL)
        assert len(alerts) == 1, alerts
        assert alerts[0].detail["problem"] == "intent_not_allowed"
        assert alerts[0].detail["intents"] == ["summarize"]
        assert await _alerts_about(fleet.admin, HONEST) == []


async def test_an_agent_rewriting_its_card_raises_a_few_alerts_a_minute(tmp_path):
    """An agent rewrote its card with intents in and out of its allowance: an alert (and a
    log line of every refused intent) per rewrite, 563 in 20 s (security re-test). A few a
    minute per agent now; `reach agents` still shows each refusal."""
    async with secured_fleet(tmp_path) as fleet:
        directory = fleet.coordinator.directory
        await eventually(lambda: EVIL in directory.refused, timeout=10)
        auth = fleet.deployment.auth("agent", EVIL)
        async with Broker(fleet.url, name="evil-again", auth=auth) as evil:
            cards = await evil.bucket(evil.names.agents_bucket, AgentCard)
            card = (await cards.get(EVIL)).value
            for n in range(6):
                intents = {**card.intents, f"grab-{n}": card.intents["summarize"]}
                await cards.put(EVIL, msgspec.structs.replace(card, intents=intents))
                await eventually(lambda n=n: f"grab-{n}" in directory.refused.get(EVIL, {}))

        async def said() -> list[Event] | None:
            alerts = await _alerts_about(fleet.admin, EVIL)
            return alerts if len(alerts) >= REFUSALS_SAID_PER_MINUTE else None

        await until_true(said)  # the rest, past the first few, are not said
        alerts = await _alerts_about(fleet.admin, EVIL)
    assert len(alerts) == REFUSALS_SAID_PER_MINUTE, [a.detail["intents"] for a in alerts]


async def test_another_replica_refuses_the_same_and_alerts_nobody_again(tmp_path):
    """A second coordinator replica started later judges every card with its allowance
    already read: the same refusal, no second alert, none about the allowed agent."""
    async with secured_fleet(tmp_path) as fleet:
        await eventually(lambda: EVIL in fleet.coordinator.directory.refused, timeout=10)
        auth = fleet.deployment.coordinator
        async with (
            Broker(fleet.url, name="coordinator-2", auth=auth) as own,
            Coordinator(own, fleet.coordinator.config).running() as second,
        ):
            assert second.directory.refused == fleet.coordinator.directory.refused
            assert await _invoke_all(fleet, "summarize", 4) == [{"by": HONEST}] * 4
        assert len(await _alerts_about(fleet.admin, EVIL)) == 1
        assert await _alerts_about(fleet.admin, HONEST) == []


async def test_reach_agents_says_which_intents_are_refused_and_why(tmp_path):
    """`reach agents`, as an operator, shows the refused intent of evil with the reason,
    and nothing refused for the agent serving what it is allowed."""
    async with secured_fleet(tmp_path) as fleet:
        creds = fleet.deployment.admin.creds
        shown = await run(
            VENV_BIN / "reach", "agents", "--nats-url", fleet.url, "--creds", str(creds)
        )
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        refusals = [line.split() for line in lines if "REFUSED" in line]
        assert [words[:2] for words in refusals] == [["REFUSED", "summarize:"]], shown.stdout
        evil_row = next(i for i, line in enumerate(lines) if line.startswith(EVIL))
        assert "REFUSED" in lines[evil_row + 1]
        assert "not allowed by its credentials (it may serve: translate)" in lines[evil_row + 1]


async def test_an_allowance_pushed_while_the_agent_runs_applies_at_once(tmp_path):
    """`reach auth allow` then push: the coordinator believes the new allowance without a
    restart — summarize reaches evil once allowed, and a new refusal raises a new alert."""
    async with secured_fleet(tmp_path) as fleet:
        directory = fleet.coordinator.directory
        fleet.deployment.directory.allow(EVIL, ("summarize", "translate"))
        await push_allowances(fleet.deployment.directory, fleet.url)
        await eventually(lambda: EVIL not in directory.refused, timeout=10)
        assert "summarize" in directory.cards[EVIL].intents
        fleet.deployment.directory.allow(EVIL, ())
        await push_allowances(fleet.deployment.directory, fleet.url)
        await eventually(lambda: len(directory.refused.get(EVIL, {})) == 2, timeout=10)
        assert await _invoke_all(fleet, "summarize", 3) == [{"by": HONEST}] * 3
        alerts = await _alerts_about(fleet.admin, EVIL)
        assert [a.detail["intents"] for a in alerts] == [["summarize"], ["summarize", "translate"]]


async def test_an_agent_cannot_write_its_own_allowance(tmp_path):
    """evil's own creds may not write the allowances bucket: the write fails, and its
    allowance stays what the operator pushed."""
    async with secured_fleet(tmp_path) as fleet:
        names = fleet.admin.names
        forged = Allowance(agent_id=EVIL, intents=("*",))
        auth = fleet.deployment.auth("agent", EVIL)
        async with Broker(fleet.url, name="evil-raw", auth=auth) as raw:
            with pytest.raises(BrokerError):
                await raw.publish(f"$KV.{bucket_name(names)}.{EVIL}", msgspec.json.encode(forged))
        kv = await fleet.admin.js.key_value(bucket_name(names))
        stored = json.loads((await kv.get(EVIL)).value)
        assert stored["intents"] == ["translate"]
        assert list(fleet.coordinator.directory.refused[EVIL]) == ["summarize"]


async def test_a_server_answer_aimed_at_an_allowance_takes_nothing_away(tmp_path):
    """evil had the server write its answer over summarizer-1's allowance (a reply subject
    is checked against no permission): summarizer-1 was refused everything until the next
    push. The coordinator keeps the last allowance it read, says so, and writes it back over
    the answer (a replica started later reads it then)."""
    async with secured_fleet(tmp_path) as fleet:
        key = f"$KV.{bucket_name(fleet.admin.names)}.{HONEST}"
        auth = fleet.deployment.auth("agent", EVIL)
        with capture_logs() as logs:
            async with Broker(fleet.url, name="evil-raw", auth=auth) as raw:
                await raw.nc.publish("$JS.API.STREAM.NAMES", b"", reply=key)
                await raw.nc.flush()
            await eventually(lambda: any("not taken for a value" in e["event"] for e in logs))
        kv = await fleet.admin.js.key_value(bucket_name(fleet.admin.names))
        await until_true(lambda: _written_back(kv, HONEST))
        assert HONEST not in fleet.coordinator.directory.refused
        assert await _invoke_all(fleet, "summarize", 2) == [{"by": HONEST}] * 2


async def test_an_allowance_overwritten_before_a_coordinator_starts_is_the_last_pushed(tmp_path):
    """No replica had kept the last allowance yet: believed as none, summarizer-1 was refused
    everything until the next push. The bucket keeps the pushed one before the answer."""
    async with secured_fleet(tmp_path) as fleet:
        key = f"$KV.{bucket_name(fleet.admin.names)}.{HONEST}"
        auth = fleet.deployment.auth("agent", EVIL)
        kv = await fleet.admin.js.key_value(bucket_name(fleet.admin.names))
        before = (await kv.get(HONEST)).revision
        async with Broker(fleet.url, name="evil-raw", auth=auth) as raw:
            await raw.nc.publish("$JS.API.STREAM.NAMES", b"", reply=key)
        # Stored (the running replica may have written the allowance back over it since).
        await until_true(lambda: _written_after(kv, HONEST, before))
        sealed = SecurityConfig(seal_key_file=fleet.deployment.seal_key_file)
        config = msgspec.structs.replace(FAST, security=sealed)
        async with (
            Broker(fleet.url, name="coordinator-2", auth=fleet.deployment.coordinator) as own,
            Coordinator(own, config).running() as second,
        ):
            await eventually(lambda: HONEST in second.directory.cards, timeout=10)
            assert HONEST not in second.directory.refused
            card = second.directory.cards[HONEST]
            assert "summarize" in card.intents


async def _written_back(kv, key: str) -> bool:  # type: ignore[no-untyped-def]
    return json.loads((await kv.get(key)).value or b"{}").get("intents") == ["summarize"]


async def _written_after(kv, key: str, revision: int) -> bool:  # type: ignore[no-untyped-def]
    return (await kv.get(key)).revision > revision


async def test_a_server_answer_aimed_at_a_card_or_a_priority_takes_nothing_away(tmp_path):
    """A caller overwrote an agent's card (the agent left routing until it wrote its card
    again, a minute later) and another caller's priorities (its P0 tasks were refused)."""
    async with secured_fleet(tmp_path) as fleet:
        names = fleet.admin.names
        directory = fleet.coordinator.directory
        fleet.deployment.directory.issue("caller", "pager", priorities=("P0", "P1", "P2"))
        await push_allowances(fleet.deployment.directory, fleet.url)
        await eventually(lambda: "P0" in directory.priorities.of("pager"))
        card = f"$KV.{names.agents_bucket}.{HONEST}"
        priorities = f"$KV.{bucket_name(names)}.priorities.pager"
        auth = fleet.deployment.auth("caller", "mallory")
        with capture_logs() as logs:
            async with Broker(fleet.url, name="mallory-raw", auth=auth) as raw:
                for target in (card, priorities):
                    await raw.nc.publish("$JS.API.STREAM.NAMES", b"", reply=target)
                await raw.nc.flush()
            await eventually(lambda: sum("not taken for a value" in e["event"] for e in logs) == 2)
        await directory.refresh()  # a route not found reads every card again
        assert HONEST in directory.cards
        assert directory.priorities.of("pager") == ("P0", "P1", "P2")
        assert await _invoke_all(fleet, "summarize", 2) == [{"by": HONEST}] * 2


async def test_a_direct_get_answer_aimed_at_a_priority_grants_nothing(tmp_path):
    """evil wrote priorities of its choosing under a key of its own and direct-got them with
    the reply aimed at mallory's priorities: mallory's P0 tasks were then taken."""
    async with secured_fleet(tmp_path) as fleet:
        names = fleet.admin.names
        own = f"$KV.{names.executions_bucket}.x.t.{EVIL}"
        direct = f"$JS.API.DIRECT.GET.KV_{names.executions_bucket}.{own}"
        forged = b'{"v": 1, "sender": "mallory", "priorities": ["P0", "P1", "P2"]}'
        target = f"$KV.{bucket_name(names)}.priorities.mallory"
        with capture_logs() as logs:
            async with Broker(
                fleet.url, name="evil-raw", auth=fleet.deployment.auth("agent", EVIL)
            ) as raw:
                await raw.publish(own, forged)
                await raw.nc.publish(direct, b"", reply=target)
                await raw.nc.flush()
            await eventually(lambda: any("not taken for a value" in e["event"] for e in logs))
        assert "P0" not in fleet.coordinator.directory.priorities.of("mallory")


async def test_the_agent_is_told_which_of_its_intents_are_refused_and_why(tmp_path):
    """Only the coordinator's log, an alert and `reach agents` said so: the agent waited for
    summarize tasks that never came. It is told after its first beat, and again when its
    allowance is narrowed while it runs."""

    def told() -> list[dict[str, Any]]:
        return [line for line in logs if line["event"].startswith("the coordinator routes this")]

    with capture_logs() as logs:
        async with secured_fleet(tmp_path) as fleet:
            await eventually(told, timeout=10)
            fleet.deployment.directory.allow(EVIL, ())
            await push_allowances(fleet.deployment.directory, fleet.url)
            await eventually(lambda: len(told()) == 2, timeout=10)
    [at_start, narrowed] = told()
    assert at_start["agent_id"] == EVIL and at_start["log_level"] == "warning"
    why = "not allowed by its credentials (it may serve: translate)"
    assert at_start["refused"] == {"summarize": why} and at_start["count"] == 1
    assert narrowed["agent_id"] == EVIL
    assert sorted(narrowed["refused"]) == ["summarize", "translate"] and narrowed["count"] == 2
