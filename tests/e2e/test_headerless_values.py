"""Values the NATS server copied, with no headers, into buckets no seal guards (protocol open
point 12). An agent stored a record of its choosing under a key of its own and aimed a direct
get asking for no headers (``no_hdr``) at another key: the server wrote the bare body there.
It fenced another agent out with epoch 999, widened the agent's own intents, took another
agent's traffic (its card saying `stopped`), and answered for another agent with a result of
its own (a `done` execution record, read as "ran already"). On a secured deployment every
writer of every bucket writes headers, so a value with none is nobody's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from structlog.testing import capture_logs

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names
from agentreach.broker.record_seal import RECORD_HEADERS, headed_buckets
from agentreach.broker.streams import last_message
from agentreach.coordinator.routing import allowances
from agentreach.envelopes import Execution, Heartbeat, encode
from tests.secured import SecuredDeployment, sealed_deployment
from tests.support import eventually, until_true

NO_HDR = b'{"no_hdr": true}'


async def _copy_bare(bad: Broker, content: bytes, target: str) -> None:
    """Have the server write ``content`` at ``target`` with no headers: stored under a key
    of ``bad``'s own (an agent's execution record), copied by a direct get."""
    own = f"$KV.{bad.names.executions_bucket}.x.forged.mallory"
    await bad.publish(own, content)
    direct = f"$JS.API.DIRECT.GET.KV_{bad.names.executions_bucket}.{own}"
    await bad.nc.publish(direct, NO_HDR, reply=target)


def _refused(logs: list[dict[str, Any]], stream: str, key: str) -> bool:
    return any(
        e["event"].startswith("a value without headers not taken")
        and e.get("stream") == stream
        and e.get("key") == key
        for e in logs
    )


def _agent(agent_id: str, *topics: str) -> Agent:
    agent = Agent(agent_id, startup_delay=0, heartbeat_interval=0.3)
    for topic in topics:

        async def answer(ctx: TaskContext, payload: Any) -> Any:
            return payload

        agent.handler(topic)(answer)
    return agent


async def test_a_bare_copy_neither_fences_an_agent_out_nor_widens_intents(tmp_path: Path):
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "bob", intents=("echo",))
    deployment.directory.issue("agent", "mallory", intents=("echo",))
    bob, mallory = _agent("bob", "echo"), _agent("mallory", "echo", "secret")
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        bob.running(url, auth=deployment.auth("agent", "bob")) as bob_runtime,
        mallory.running(url, auth=deployment.auth("agent", "mallory")),
        Broker(url, name="mallory", auth=deployment.auth("agent", "mallory")) as bad,
    ):
        names = admin.names
        await eventually(lambda: {"bob", "mallory"} <= set(coordinator.directory.cards))
        assert not coordinator.directory.serving("secret")  # not allowed
        beats = await admin.js.key_value(names.heartbeats_bucket)
        epoch = (await _beat(beats)).epoch

        with capture_logs() as logs:
            widened = allowances.Allowance(agent_id="mallory", intents=("echo", "secret"))
            await _copy_bare(bad, encode(widened), f"$KV.{allowances.bucket_name(names)}.mallory")
            await eventually(lambda: _refused(logs, f"KV_{names.prefix}_allowances", "mallory"))
        assert not coordinator.directory.serving("secret")

        fence = Heartbeat(agent_id="bob", epoch=999, seq=1, interval_s=15.0)
        await _copy_bare(bad, encode(fence), f"$KV.{names.heartbeats_bucket}.bob")
        forged = await until_true(lambda: _forged_revision(beats), timeout=10, every_s=0.02)
        await until_true(lambda: _beaten_over(beats, forged, epoch), timeout=10)
        assert not bob_runtime.replaced.is_set()
        assert "bob" in {card.agent_id for card in coordinator.directory.serving("echo")}


async def _beat(beats: Any) -> Heartbeat:
    return msgspec.json.decode((await beats.get("bob")).value, type=Heartbeat)


async def _forged_revision(beats: Any) -> int | None:
    entry = await beats.get("bob")
    return entry.revision if (await _beat(beats)).epoch == 999 else None


async def _beaten_over(beats: Any, forged: int, epoch: int) -> bool:
    entry = await beats.get("bob")
    return entry.revision > forged and (await _beat(beats)).epoch == epoch


async def test_a_bare_copy_neither_answers_for_an_agent_nor_stops_its_card(tmp_path: Path):
    """A `done` record copied onto bob's key for alice's next message made bob answer her with
    mallory's result (its handler never ran); bob's card copied as `stopped` sent all its
    traffic elsewhere, for good."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "bob", intents=("echo",))
    deployment.directory.issue("agent", "mallory", intents=("other",))
    bob = _agent("bob", "echo")
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        bob.running(url, auth=deployment.auth("agent", "bob")),
        Broker(url, name="mallory", auth=deployment.auth("agent", "mallory")) as bad,
        ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
    ):
        names = admin.names
        await eventually(lambda: "bob" in coordinator.directory.cards)
        forged = Execution(message_id="order-1", state="done", agent_id="bob", result="FORGED")
        await _copy_bare(bad, encode(forged), f"$KV.{names.executions_bucket}.alice.order-1.bob")
        assert await alice.invoke("echo", {"n": 1}, message_id="order-1") == {"n": 1}

        card = coordinator.directory.cards["bob"]
        stopped = msgspec.structs.replace(card, status="stopped")
        with capture_logs() as logs:
            await _copy_bare(bad, encode(stopped), f"$KV.{names.agents_bucket}.bob")
            await eventually(lambda: _refused(logs, f"KV_{names.agents_bucket}", "bob"))
        assert coordinator.directory.cards["bob"].status == "running"
        assert await alice.invoke("echo", {"n": 2}) == {"n": 2}


def test_every_bucket_is_read_headed_by_secured_parties() -> None:
    names = Names(prefix="acme")
    assert {f"acme_{b}" for b in ("agents", "executions", "heartbeats", "allowances")} <= (
        headed_buckets(names)
    )
    assert RECORD_HEADERS == {"Reach-Kind": "record"}


async def test_copies_outnumbering_the_history_do_not_erase_an_allowance(tmp_path: Path):
    """More copies than the bucket keeps revisions of a key (5) pushed bob's allowance out:
    the running coordinator went on with what it knew, but one started later found none and
    routed bob nothing until `reach auth push`. The coordinator writes it back over them."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "bob", intents=("echo",))
    deployment.directory.issue("agent", "mallory", intents=("other",))
    async with (
        sealed_deployment(deployment, tmp_path / "server") as (url, admin, coordinator),
        Broker(url, name="mallory", auth=deployment.auth("agent", "mallory")) as bad,
    ):
        name = allowances.bucket_name(admin.names)
        bucket = await admin.bucket(name, allowances.Allowance)
        held = await bucket.get("bob")
        before, revision = held.value, held.revision
        await eventually(lambda: coordinator.directory.enforce_allowances)
        nothing = allowances.Allowance(agent_id="bob", intents=())
        for _ in range(7):
            await _copy_bare(bad, encode(nothing), f"$KV.{name}.bob")

        async def written_back() -> bool:
            stored = await last_message(admin, f"KV_{name}", f"$KV.{name}.bob")
            if stored is None or stored.stream_seq <= revision + 7:  # not all copies in yet
                return False
            return bool(stored.headers) and b"echo" in stored.data

        await until_true(written_back)
        assert (await bucket.get("bob")).value == before  # as a replica started now reads it
