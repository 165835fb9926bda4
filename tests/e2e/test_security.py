"""Nobody can act as someone else: each attack of issue 13, N times, on a secured server.

The parties are real: a nats-server with decentralized JWT auth (``reach auth``), a
coordinator with its service identity and seal key, agent ``worker-x`` serving through the
SDK, callers ``alice`` and ``bob``. The attackers are agent ``worker-y`` and caller ``alice``
with their own valid creds, on raw connections, plus anonymous clients. An attack counts as
a success only when its effect is seen by another party (the operator reading streams and
buckets, a victim's subscription, alice's pending call), never because a call returned. When
permissions stop an attack, the server must also have reported the violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import (
    Agent,
    CompensationWorker,
    PermanentError,
    ReachClient,
    Rejected,
    TaskContext,
    TaskFailed,
)
from agentreach.auth import jwt
from agentreach.broker import (
    Auth,
    AuthenticationFailed,
    Broker,
    Names,
    Topology,
    provision,
    read_stream,
)
from agentreach.broker.lifecycle import trace_of
from agentreach.broker.presence import Presence, ProbeResult, probe
from agentreach.broker.streams import last_message
from agentreach.cli.auth import push_allowances
from agentreach.coordinator import ConfigError, Coordinator
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.protection.grants import (
    UNSEALED_ENV,
    SecurityConfig,
)
from agentreach.coordinator.protection.rate_limits import RateLimits
from agentreach.coordinator.workflows.control import read_record
from agentreach.envelopes import RateLimit
from agentreach.envelopes.headers import task_headers
from tests.cli.conftest import reach_command
from tests.conftest import FAST
from tests.secured import SecuredDeployment, secured_server
from tests.support import until_true

pytestmark = pytest.mark.asyncio(loop_scope="module")

N = 5  # attempts per attack
X, Y = "worker-x", "worker-y"
NAMES = Names()
P1 = NAMES.dispatch_stream("P1")
X_CONSUMER = NAMES.agent_consumer(X, "P1")
QUICK = 0.3  # seconds an attacker's request may take: refusals show up as timeouts
# A workflow that runs until an event it never gets (bob's, the victim of a cancel).
WAITS = "waits-flow"
WAITS_FLOW = wf.machine(
    "hold", {"hold": wf.state(next=[wf.go("done", event="go")]), "done": wf.state(terminal=True)}
)

# What a party's message carries at least: one with no headers is a server's answer.
AS_SENT = {"Reach-Kind": "event"}


@dataclass
class Arena:
    """The parties, what the operator sees, and the victims' own observations."""

    deployment: SecuredDeployment
    url: str
    admin: Broker
    y: Broker  # agent worker-y, attacking
    alice_raw: Broker  # caller alice, attacking
    alice: ReachClient  # caller alice, waiting for a result
    server_log: list[str]
    x_seen: list[Any]  # payloads agent worker-x ran
    release: asyncio.Event  # lets worker-x finish the task it holds
    release_step: asyncio.Event = field(default_factory=asyncio.Event)  # and the workflow step
    held: envelopes.Task | None = None  # the task worker-x holds, as alice sent it
    pending: asyncio.Task[Any] | None = None  # alice's invoke of the held task
    spy: Broker | None = None  # compensation worker spy-w, attacking
    alice_heard: list[bytes] = field(default_factory=list)  # everything in alice's spaces
    bob_heard: list[bytes] = field(default_factory=list)

    def violations(self, connection: str) -> int:
        """Permission violations the server reported for that connection name."""
        tag = f':{connection}"'
        return sum(1 for line in self.server_log if tag in line and "Violation" in line)

    async def stored(self, stream: str, subject: str = ">") -> list[bytes]:
        return [m.data for m in await read_stream(self.admin, stream, subject)]

    async def stored_with(self, stream: str, marker: bytes, subject: str = ">") -> bool:
        return any(marker in data for data in await self.stored(stream, subject))

    async def kv(self, bucket: str, key: str) -> bytes | None:
        try:
            entry = await (await self.admin.js.key_value(bucket)).get(key)
        except Exception:
            return None
        return entry.value


def marker() -> bytes:
    return f"forged-{uuid.uuid4().hex[:12]}".encode()


async def quietly(call: Awaitable[Any], timeout: float = QUICK) -> Any:
    """An attacker's call: a refusal (timeout, error) is just None."""
    try:
        return await asyncio.wait_for(call, timeout)
    except Exception:
        return None


async def settle(*connections: Broker) -> None:
    """Let what was published reach its subscribers (and the server's log)."""
    for connection in connections:
        with contextlib.suppress(Exception):
            await connection.nc.flush(timeout=1)
    await asyncio.sleep(0.05)


# -- the arena ---------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def arena(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Arena]:
    root = tmp_path_factory.mktemp("secured")
    deployment = SecuredDeployment(root / "auth")
    server_log: list[str] = []
    config = msgspec.structs.replace(
        FAST,
        security=SecurityConfig(seal_key_file=deployment.seal_key_file),
        rate_limits=RateLimits(callers={"greedy": RateLimit(rate=0.1, burst=2)}),
        workflows={"held-flow": wf.chain(wf.step("a", "hold-step")), WAITS: WAITS_FLOW},
    )
    x_seen: list[Any] = []
    release, release_step = asyncio.Event(), asyncio.Event()
    agent = Agent(X, startup_delay=0)

    @agent.handler("summarize", capacity=8)
    async def summarize(ctx: TaskContext, payload: Any) -> Any:
        x_seen.append(payload)
        return {"summary": "real"}

    @agent.handler("hold-step")
    async def hold_step(ctx: TaskContext, payload: Any) -> Any:
        x_seen.append(payload)
        await release_step.wait()
        return {"summary": "real"}

    @agent.handler("hold", capacity=2)
    async def hold(ctx: TaskContext, payload: Any) -> Any:
        x_seen.append(payload)
        await release.wait()
        return {"summary": "real"}

    async with secured_server(deployment, root / "server", on_log=server_log.append) as server:
        url = server.url
        async with (
            Broker(url, name="admin", auth=deployment.admin) as admin,
            Broker(url, name="coordinator", auth=deployment.coordinator) as coordinator_connection,
        ):
            await provision(admin, Topology.default(admin.names))
            # The operator allows worker-x the intents it serves (worker-y: none).
            deployment.directory.issue("agent", X, intents=("summarize", "hold", "hold-step"))
            await push_allowances(deployment.directory, url)
            async with (
                Coordinator(coordinator_connection, config).running(),
                agent.running(url, auth=deployment.auth("agent", X)),
                Broker(url, name="attacker-y", auth=deployment.auth("agent", Y)) as y,
                Broker(url, name="attacker-alice", auth=deployment.auth("caller", "alice")) as a,
                Broker(url, name="bob", auth=deployment.auth("caller", "bob")) as bob,
                ReachClient(url, name="alice", auth=deployment.auth("caller", "alice")) as alice,
                Broker(url, name=WORKER, auth=deployment.auth("worker", "spy-w")) as spy,
            ):
                arena = Arena(deployment, url, admin, y, a, alice, server_log, x_seen, release)
                arena.release_step = release_step
                arena.spy = spy
                await a.nc.subscribe("reach.reply.alice.>", cb=_keep(arena.alice_heard))
                await a.nc.subscribe("_INBOX_alice.trap", cb=_keep(arena.alice_heard))
                await bob.nc.subscribe("reach.reply.bob.>", cb=_keep(arena.bob_heard))
                await bob.nc.subscribe("_INBOX_bob.trap", cb=_keep(arena.bob_heard))
                await _hold_a_task(arena)
                yield arena
                release.set()
                assert await arena.pending == {"summary": "real"}  # alice got the real one


def _keep(into: list[bytes]) -> Callable[[Any], Awaitable[None]]:
    async def keep(msg: Any) -> None:
        into.append(msg.data)

    return keep


async def _hold_a_task(arena: Arena) -> None:
    """alice invokes ``hold``: worker-x takes it and keeps it in flight meanwhile."""
    arena.pending = asyncio.create_task(
        arena.alice.invoke("hold", {"n": "held"}, execute_deadline_ms=600_000)
    )
    async with asyncio.timeout(10):
        while {"n": "held"} not in arena.x_seen:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    stored = await read_stream(arena.admin, P1, NAMES.dispatch(X, "P1"))
    arena.held = envelopes.decode_task(stored[-1].data)  # in flight, so still in the stream


# -- the attacks -------------------------------------------------------------------------

Attempt = Callable[[Arena, int], Awaitable[bool]]


@dataclass(frozen=True)
class Attack:
    actor: str  # the attacker's connection name
    title: str
    stopped_by: str  # permissions | server | coordinator | client | bucket config
    attempt: Attempt


ATTACKS: list[Attack] = []


def attack(actor: str, title: str, stopped_by: str) -> Callable[[Attempt], Attempt]:
    def register(attempt: Attempt) -> Attempt:
        ATTACKS.append(Attack(actor, title, stopped_by, attempt))
        return attempt

    return register


AGENT, CALLER, WORKER = "attacker-y", "attacker-alice", "attacker-w"


@attack(AGENT, "pull a task from X's consumer", "permissions")
async def _pull_x(arena: Arena, i: int) -> bool:
    await arena.alice.publish("summarize", {"n": f"queued-{i}"})
    sub = await quietly(arena.y.js.pull_subscribe_bind(durable=X_CONSUMER, stream=P1))
    got = await quietly(sub.fetch(1, timeout=QUICK)) if sub else None
    return bool(got)


@attack(AGENT, "ack (term) X's task in flight on its $JS.ACK subject", "permissions")
async def _term_x(arena: Arena, i: int) -> bool:
    held = await read_stream(arena.admin, P1, NAMES.dispatch(X, "P1"))
    if not held:
        return False
    seq = held[0].stream_seq
    await arena.y.nc.publish(
        f"$JS.ACK.{P1}.{X_CONSUMER}.1.{seq}.1.{held[0].timestamp_ns}.0", b"+TERM"
    )
    await settle(arena.y)
    return not await read_stream(arena.admin, P1, NAMES.dispatch(X, "P1"))


@attack(AGENT, "create a consumer filtered on X's dispatch subject", "permissions")
async def _consumer_on_x(arena: Arena, i: int) -> bool:
    config = nats.js.api.ConsumerConfig(
        durable_name=f"spy-{i}", filter_subject=NAMES.dispatch(X, "P1")
    )
    await quietly(arena.y.js.add_consumer(P1, config=config))
    return await quietly(arena.admin.js.consumer_info(P1, f"spy-{i}")) is not None


async def _smuggle(arena: Arena, filters: dict[str, Any]) -> bool:
    """Y creates its own consumer through its allowed subject, with X's filter in the body."""
    own = NAMES.agent_consumer(Y, "P1")
    body = {"stream_name": P1, "config": {"name": own, "ack_policy": "explicit", **filters}}
    subject = f"$JS.API.CONSUMER.CREATE.{P1}.{own}.{NAMES.dispatch(Y, 'P1')}"
    await quietly(arena.y.nc.request(subject, json.dumps(body).encode(), timeout=QUICK))
    info = await quietly(arena.admin.js.consumer_info(P1, own))
    seen = [info.config.filter_subject, *(info.config.filter_subjects or [])] if info else []
    return NAMES.dispatch(X, "P1") in seen


@attack(AGENT, "own consumer, X's subject as the body's filter_subject", "server")
async def _smuggle_filter(arena: Arena, i: int) -> bool:
    return await _smuggle(arena, {"filter_subject": NAMES.dispatch(X, "P1")})


@attack(AGENT, "own consumer, X's subject in filter_subjects[]", "server")
async def _smuggle_filters(arena: Arena, i: int) -> bool:
    return await _smuggle(arena, {"filter_subjects": [NAMES.dispatch(X, "P1")]})


@attack(AGENT, "ephemeral consumer on X's dispatch subject", "permissions")
async def _ephemeral(arena: Arena, i: int) -> bool:
    sub = await quietly(arena.y.js.pull_subscribe(NAMES.dispatch(X, "P1"), stream=P1))
    return sub is not None


@attack(AGENT, "subscribe to X's dispatch subject (and reach.agent.>)", "permissions")
async def _sniff_dispatch(arena: Arena, i: int) -> bool:
    seen: list[bytes] = []
    subs = [
        await arena.y.nc.subscribe(NAMES.dispatch(X, "P1"), cb=_keep(seen)),
        await arena.y.nc.subscribe("reach.agent.>", cb=_keep(seen)),
    ]
    await arena.alice.invoke("summarize", {"n": f"sniffed-{i}"})
    for sub in subs:
        await sub.unsubscribe()
    return bool(seen)


@attack(AGENT, "read X's dispatched tasks with DIRECT.GET / STREAM.MSG.GET", "permissions")
async def _direct_get(arena: Arena, i: int) -> bool:
    subject = NAMES.dispatch(X, "P1")
    direct = await quietly(arena.y.nc.request(f"$JS.API.DIRECT.GET.{P1}.{subject}", b""))
    by_seq = await quietly(
        arena.y.nc.request(
            f"$JS.API.STREAM.MSG.GET.{P1}", b'{"last_by_subj": "%s"}' % subject.encode()
        )
    )
    return bool(direct and direct.data) or bool(by_seq and b'"message"' in by_seq.data)


async def _kv_write(arena: Arena, actor: Broker, bucket: str, key: str, delete: bool) -> bool:
    """Whether ``actor`` put its marker under ``key`` (or deleted an existing key)."""
    note = marker()
    existed = await arena.kv(bucket, key) is not None
    headers = {"KV-Operation": "DEL"} if delete else None
    await quietly(actor.js.publish(f"$KV.{bucket}.{key}", note, headers=headers))
    now = await arena.kv(bucket, key)
    return (existed and now is None) if delete else now == note


@attack(AGENT, "write X's heartbeat", "permissions")
async def _x_heartbeat(arena: Arena, i: int) -> bool:
    return await _kv_write(arena, arena.y, NAMES.heartbeats_bucket, X, delete=False)


@attack(AGENT, "overwrite X's card (X would vanish from routing)", "permissions")
async def _x_card(arena: Arena, i: int) -> bool:
    return await _kv_write(arena, arena.y, NAMES.agents_bucket, X, delete=False)


@attack(AGENT, "delete X's card", "permissions")
async def _x_card_deleted(arena: Arena, i: int) -> bool:
    return await _kv_write(arena, arena.y, NAMES.agents_bucket, X, delete=True)


@attack(AGENT, "write a fake agent's card", "permissions")
async def _fake_card(arena: Arena, i: int) -> bool:
    return await _kv_write(arena, arena.y, NAMES.agents_bucket, f"worker-z{i}", delete=False)


@attack(AGENT, "write the coordinator's liveness, lease and breaker records", "permissions")
async def _coordinator_state(arena: Arena, i: int) -> bool:
    written = [
        await _kv_write(arena, arena.y, NAMES.liveness_bucket, X, delete=False),
        await _kv_write(arena, arena.y, NAMES.leases_bucket, "liveness", delete=False),
        await _kv_write(arena, arena.y, NAMES.breakers_bucket, X, delete=False),
    ]
    return any(written)


def _event(about: envelopes.Task, kind: str, agent_id: str, note: bytes, **detail: Any) -> bytes:
    fields = {
        "v": 1,
        "kind": "event",
        "event": kind,
        "message_id": about.message_id,
        "trace_id": about.trace_id,
        "topic": about.topic,
        "agent_id": agent_id,
        "detail": {"note": note.decode(), **detail},
    }
    return json.dumps(fields).encode()


def _event_subject(task: envelopes.Task, kind: str, sender: str) -> str:
    return NAMES.event(kind, task.topic, task.trace_id, task.message_id, sender)


@attack(AGENT, "publish a completed event as X (X's sender token)", "permissions")
async def _completed_as_x(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None
    body = _event(task, "completed", X, note, result="forged")
    await quietly(arena.y.js.publish(_event_subject(task, "completed", X), body, headers=AS_SENT))
    return await arena.stored_with(NAMES.events_stream, note)


@attack(AGENT, "publish coordinator-only events (routed, dead_lettered, ...)", "permissions")
async def _coordinator_events(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None
    for kind in ("routed", "dead_lettered", "retry_scheduled", "impersonation"):
        body = _event(task, kind, Y, note)
        await quietly(arena.y.js.publish(_event_subject(task, kind, Y), body, headers=AS_SENT))
    return await arena.stored_with(NAMES.events_stream, note)


async def _trace_shows(arena: Arena, note: bytes) -> bool:
    """Whether the held task's trace (``reach trace``, the coordinator's reading) has it."""
    assert arena.held is not None
    trace = await trace_of(arena.admin, arena.held.message_id)
    return any(e.detail.get("note") == note.decode() for e in trace)


@attack(AGENT, "event on its own subject whose body claims to be X", "coordinator")
async def _claims_x(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None
    body = _event(task, "completed", X, note, result="forged")
    await quietly(arena.y.js.publish(_event_subject(task, "completed", Y), body, headers=AS_SENT))
    return await _trace_shows(arena, note) or arena.pending.done()  # type: ignore[union-attr]


@attack(AGENT, "completed event in its own name for the task given to X", "coordinator")
async def _ungranted(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None
    body = _event(task, "completed", Y, note, result="forged", grant=uuid.uuid4().hex)
    await quietly(arena.y.js.publish(_event_subject(task, "completed", Y), body, headers=AS_SENT))
    await asyncio.sleep(0.1)  # the coordinator's outcome loop has its chance to take it
    return await _trace_shows(arena, note) or arena.pending.done()  # type: ignore[union-attr]


def _result(task: envelopes.Task, from_agent: str, note: bytes) -> bytes:
    fields = {
        "v": 1,
        "kind": "result",
        "message_id": task.message_id,
        "trace_id": task.trace_id,
        "topic": task.topic,
        "from_agent": from_agent,
        "result": {"summary": note.decode()},
    }
    return json.dumps(fields).encode()


@attack(AGENT, "send alice a result as X (its box, X's sender token)", "permissions")
async def _result_as_x(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None and task.reply_to
    await arena.y.nc.publish(f"{task.reply_to}.{X}", _result(task, X, note), headers=AS_SENT)
    await settle(arena.y, arena.alice_raw)
    return any(note in data for data in arena.alice_heard)


@attack(AGENT, "result in its own name claiming from_agent = X", "client")
async def _result_claiming_x(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None and task.reply_to
    await arena.y.nc.publish(f"{task.reply_to}.{Y}", _result(task, X, note), headers=AS_SENT)
    await settle(arena.y, arena.alice_raw)
    assert any(note in data for data in arena.alice_heard)  # it reached alice's box...
    return arena.pending.done()  # type: ignore[union-attr]  # ...and was not taken


@attack(AGENT, "result in its own name for the task routed to X", "client")
async def _result_unrouted(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None and task.reply_to
    await arena.y.nc.publish(f"{task.reply_to}.{Y}", _result(task, Y, note))
    await settle(arena.y, arena.alice_raw)
    return arena.pending.done()  # type: ignore[union-attr]


@attack(AGENT, "publish straight into alice's inbox", "permissions")
async def _into_inbox(arena: Arena, i: int) -> bool:
    note = marker()
    await arena.y.nc.publish("_INBOX_alice.trap", note)
    await settle(arena.y, arena.alice_raw)
    return any(note in data for data in arena.alice_heard)


async def _answer_probe(arena: Arena, subject: str) -> bool:
    heard: list[bytes] = []

    async def answer(msg: Any) -> None:
        heard.append(msg.data)
        await msg.respond(b"forged")

    sub = await arena.y.nc.subscribe(subject, cb=answer)
    await settle(arena.y)
    answers: list[bytes] = []
    inbox = arena.admin.nc.new_inbox()
    replies = await arena.admin.nc.subscribe(inbox, cb=_keep(answers))
    await arena.admin.nc.publish(subject, b"", reply=inbox)
    await settle(arena.admin, arena.y)
    await replies.unsubscribe()
    await sub.unsubscribe()
    return bool(heard) or b"forged" in answers


@attack(AGENT, "answer X's presence probe", "permissions")
async def _presence(arena: Arena, i: int) -> bool:
    return await _answer_probe(arena, NAMES.presence(X))


@attack(AGENT, "answer X's application ping", "permissions")
async def _ping(arena: Arena, i: int) -> bool:
    return await _answer_probe(arena, NAMES.ping(X))


async def _answered_by_itself(arena: Arena, own_subject: str) -> bool:
    """Y sends itself a message, on a subject it may both publish and subscribe to, whose
    reply subject is alice's inbox, and answers it: with a response permission, the server
    would let that answer through (and so a publish anywhere in the account)."""
    note, answered = marker(), asyncio.Event()

    async def answer(msg: Any) -> None:
        with contextlib.suppress(Exception):
            await msg.respond(note)
        answered.set()

    sub = await arena.y.nc.subscribe(own_subject, cb=answer)
    await settle(arena.y)
    await arena.y.nc.publish(own_subject, b"", reply="_INBOX_alice.trap")
    await quietly(answered.wait(), 1.0)
    await settle(arena.y, arena.alice_raw)
    await sub.unsubscribe()
    return any(note in data for data in arena.alice_heard)


@attack(AGENT, "publish anywhere as the answer to itself, on its presence subject", "permissions")
async def _through_own_presence(arena: Arena, i: int) -> bool:
    return await _answered_by_itself(arena, NAMES.presence(Y))


@attack(AGENT, "publish anywhere as the answer to itself, in its own reply box", "permissions")
async def _through_own_box(arena: Arena, i: int) -> bool:
    return await _answered_by_itself(arena, f"{NAMES.reply_box(Y, 'own')}.{Y}")


@attack(AGENT, "register as X", "permissions")
async def _register_as_x(arena: Arena, i: int) -> bool:
    body = json.dumps({"agent_id": X}).encode()
    return await quietly(arena.y.nc.request(NAMES.register(X), body, timeout=QUICK)) is not None


@attack(AGENT, "send X a control message", "permissions")
async def _control_x(arena: Arena, i: int) -> bool:
    heard: list[bytes] = []
    watch = await arena.admin.nc.subscribe(NAMES.agent_control(X), cb=_keep(heard))
    await settle(arena.admin)
    await arena.y.nc.publish(NAMES.agent_control(X), b'{"heartbeat_interval_s": 3600}')
    await settle(arena.y, arena.admin)
    await watch.unsubscribe()
    return bool(heard)


def _task(payload: Any, topic: str = "summarize", **fields: Any) -> bytes:
    message_id = f"m{uuid.uuid4().hex[:16]}"
    envelope = {
        "v": 1,
        "kind": "task",
        "message_id": message_id,
        "trace_id": message_id,
        "topic": topic,
        "payload": payload,
        **fields,
    }
    return json.dumps(envelope).encode()


async def _x_ran(arena: Arena, note: bytes) -> bool:
    await asyncio.sleep(0.2)  # time for a task that got through to reach worker-x
    return any(note.decode() in json.dumps(p) for p in arena.x_seen)


@attack(AGENT, "dispatch a forged task straight to X", "permissions")
async def _forged_dispatch(arena: Arena, i: int) -> bool:
    note = marker()
    await quietly(arena.y.js.publish(NAMES.dispatch(X, "P1"), _task({"n": note.decode()})))
    return await _x_ran(arena, note)


@attack(AGENT, "submit a task as caller alice", "permissions")
async def _task_as_alice(arena: Arena, i: int) -> bool:
    note = marker()
    await quietly(arena.y.js.publish(NAMES.task("summarize", "alice"), _task({"n": note.decode()})))
    return await _x_ran(arena, note)


@attack(AGENT, "submit a task in the operators' bare form", "permissions")
async def _task_bare(arena: Arena, i: int) -> bool:
    note = marker()
    await quietly(arena.y.js.publish(NAMES.task("summarize"), _task({"n": note.decode()})))
    return await _x_ran(arena, note)


@attack(AGENT, "publish a forged dead letter", "permissions")
async def _forged_letter(arena: Arena, i: int) -> bool:
    note = marker()
    await quietly(arena.y.js.publish(NAMES.dlq("failed", "summarize"), note))
    return await arena.stored_with(NAMES.dlq_stream, note)


async def _reads_events(arena: Arena, actor: Broker) -> bool:
    seen: list[bytes] = []
    sub = await actor.nc.subscribe(NAMES.events_wildcard, cb=_keep(seen))
    consumer = await quietly(actor.js.pull_subscribe(NAMES.events_wildcard, stream="REACH_EVENTS"))
    fetched = await quietly(consumer.fetch(1, timeout=QUICK)) if consumer else None
    await arena.alice.invoke("summarize", {"n": "traffic"})
    await sub.unsubscribe()
    return bool(seen) or bool(fetched)


@attack(AGENT, "read the event stream (other agents' results)", "permissions")
async def _agent_reads_events(arena: Arena, i: int) -> bool:
    return await _reads_events(arena, arena.y)


@attack(AGENT, "read X's inbox", "permissions")
async def _x_inbox(arena: Arena, i: int) -> bool:
    seen: list[bytes] = []
    sub = await arena.y.nc.subscribe(f"_INBOX_{X}.>", cb=_keep(seen))
    await arena.alice.invoke("summarize", {"n": "traffic"})
    await sub.unsubscribe()
    return bool(seen)


@attack(AGENT, "read X's execution records (wildcards, bare direct get, watch)", "permissions")
async def _x_executions(arena: Arena, i: int) -> bool:
    bucket = NAMES.executions_bucket
    stream = f"KV_{bucket}"
    asks = [
        (f"$JS.API.DIRECT.GET.{stream}.$KV.{bucket}.>", b""),
        (f"$JS.API.DIRECT.GET.{stream}.$KV.{bucket}.*.*.*", b""),
        (f"$JS.API.DIRECT.GET.{stream}.$KV.{bucket}.*.*.{X}", b""),
        (f"$JS.API.DIRECT.GET.{stream}", json.dumps({"last_by_subj": f"$KV.{bucket}.>"}).encode()),
        (f"$JS.API.STREAM.MSG.GET.{stream}", b'{"seq": 1}'),
    ]
    answers = [await quietly(arena.y.nc.request(s, body, timeout=QUICK)) for s, body in asks]
    watch = await quietly(arena.y.js.pull_subscribe(f"$KV.{bucket}.>", stream=stream))
    return any(a is not None and X.encode() in a.data for a in answers) or watch is not None


@attack(AGENT, "mark X's task done with a forged record", "permissions")
async def _x_execution_written(arena: Arena, i: int) -> bool:
    task = arena.held
    assert task is not None
    key = envelopes.execution_key(task.caller or "alice", task.message_id, X)
    return await _kv_write(arena, arena.y, NAMES.executions_bucket, key, delete=False)


@attack(AGENT, "suppress X's completed event by publishing its Nats-Msg-Id first", "coordinator")
async def _suppress(arena: Arena, i: int) -> bool:
    message_id = f"sup{uuid.uuid4().hex[:12]}"
    task = arena.alice.task("summarize", {"n": f"suppressed-{i}"}, message_id=message_id)
    for guess in (f"{message_id}-completed-1-{X}", f"{message_id}-completed-1"):
        body = _event(task, "completed", Y, marker())
        await quietly(
            arena.y.js.publish(
                _event_subject(task, "completed", Y), body, headers={"Nats-Msg-Id": guess}
            )
        )
    await arena.alice.submit(task)

    async def completed_by_x() -> bool:
        trace = await trace_of(arena.admin, message_id)
        return any(e.event == "completed" and e.agent_id == X for e in trace)

    async with asyncio.timeout(10):
        while not await completed_by_x():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return False  # X's completed was recorded: the attempt did not suppress it


@attack(AGENT, "report X's task failed with a rewritten task to retry", "coordinator")
async def _rewritten_retry(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None
    rewritten = json.loads(envelopes.encode(task))
    rewritten["payload"] = {"n": note.decode()}
    body = _event(task, "failed", Y, note, task=rewritten, error={"type": "x", "retryable": True})
    await quietly(arena.y.js.publish(_event_subject(task, "failed", Y), body, headers=AS_SENT))
    return await _x_ran(arena, note)


@attack(AGENT, "wipe the agents bucket through its own key (Nats-Rollup: all)", "bucket config")
async def _rollup(arena: Arena, i: int) -> bool:
    key = f"$KV.{NAMES.agents_bucket}.{Y}"
    await quietly(arena.y.js.publish(key, b"", headers={"Nats-Rollup": "all"}))
    return await arena.kv(NAMES.agents_bucket, X) is None


async def _dlq_wiped(arena: Arena, actor: Broker) -> bool:
    await arena.admin.publish(NAMES.dlq("failed", "victim"), b'{"kept": true}')
    before = await arena.stored(NAMES.dlq_stream)
    for call in (
        actor.js.purge_stream(NAMES.dlq_stream),
        actor.js.delete_msg(NAMES.dlq_stream, 1),
        actor.js.delete_stream(NAMES.dlq_stream),
        actor.js.delete_stream(NAMES.events_stream),
    ):
        await quietly(call)
    after = await quietly(arena.stored(NAMES.dlq_stream))
    return after != before or await quietly(arena.admin.js.stream_info(NAMES.events_stream)) is None


@attack(AGENT, "delete or purge REACH_DLQ, delete REACH_EVENTS or a dead letter", "permissions")
async def _agent_wipes_dlq(arena: Arena, i: int) -> bool:
    return await _dlq_wiped(arena, arena.y)


@attack(AGENT, "delete X's consumer", "permissions")
async def _delete_x_consumer(arena: Arena, i: int) -> bool:
    await quietly(arena.y.js.delete_consumer(P1, X_CONSUMER))
    return await quietly(arena.admin.js.consumer_info(P1, X_CONSUMER)) is None


# -- caller alice ------------------------------------------------------------------------


@attack(CALLER, "read dispatched tasks (subscribe, pull X's consumer)", "permissions")
async def _caller_reads_dispatch(arena: Arena, i: int) -> bool:
    seen: list[bytes] = []
    sub = await arena.alice_raw.nc.subscribe("reach.agent.>", cb=_keep(seen))
    await arena.alice.publish("summarize", {"n": f"queued-{i}"})
    bound = await quietly(arena.alice_raw.js.pull_subscribe_bind(durable=X_CONSUMER, stream=P1))
    got = await quietly(bound.fetch(1, timeout=QUICK)) if bound else None
    await arena.alice.invoke("summarize", {"n": "traffic"})
    await sub.unsubscribe()
    return bool(seen) or bool(got)


@attack(CALLER, "forge a completed event (as X, as itself, as the coordinator)", "permissions")
async def _caller_forges_event(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None
    for sender in (X, "alice", "_coordinator"):
        body = _event(task, "completed", X, note)
        await quietly(arena.alice_raw.js.publish(_event_subject(task, "completed", sender), body))
    return await arena.stored_with(NAMES.events_stream, note)


@attack(CALLER, "send bob a forged result (as X, as the coordinator)", "permissions")
async def _caller_forges_result(arena: Arena, i: int) -> bool:
    task, note = arena.held, marker()
    assert task is not None
    for sender in (X, "_coordinator"):
        await arena.alice_raw.nc.publish(f"reach.reply.bob.box1.{sender}", _result(task, X, note))
    await settle(arena.alice_raw)
    await asyncio.sleep(0.05)
    return any(note in data for data in arena.bob_heard)


@attack(CALLER, "read bob's replies and inbox", "permissions")
async def _caller_spies(arena: Arena, i: int) -> bool:
    seen: list[bytes] = []
    subs = [
        await arena.alice_raw.nc.subscribe("reach.reply.bob.>", cb=_keep(seen)),
        await arena.alice_raw.nc.subscribe("_INBOX_bob.>", cb=_keep(seen)),
    ]
    await settle(arena.alice_raw)
    await arena.admin.nc.publish("reach.reply.bob.box1._coordinator", b"for bob")
    await arena.admin.nc.publish("_INBOX_bob.trap", b"for bob")
    await settle(arena.admin, arena.alice_raw)
    for sub in subs:
        await sub.unsubscribe()
    return bool(seen)


@attack(CALLER, "submit tasks as bob, or in the operators' bare form", "permissions")
async def _caller_as_bob(arena: Arena, i: int) -> bool:
    note = marker()
    for subject in (NAMES.task("summarize", "bob"), NAMES.task("summarize")):
        await quietly(arena.alice_raw.js.publish(subject, _task({"n": note.decode()})))
    return await _x_ran(arena, note)


@attack(CALLER, "task whose reply_to is bob's box", "coordinator")
async def _caller_redirects(arena: Arena, i: int) -> bool:
    note = marker()
    body = _task({"n": note.decode()}, reply_to="reach.reply.bob.box1")
    await arena.alice_raw.js.publish(NAMES.task("summarize", "alice"), body)
    message_id = json.loads(body)["message_id"].encode()
    ran = await _x_ran(arena, note)
    return ran or any(message_id in data for data in arena.bob_heard)


async def _lists_subjects(actor: Broker, i: int) -> bool:
    """Stream info with a subject filter lists every subject a stream holds: topics, trace
    and message ids, callers, agents. Each stream is asked once over the attempts."""
    streams = [NAMES.events_stream, NAMES.tasks_stream, P1, NAMES.dlq_stream]
    streams += [f"KV_{b}" for b in (NAMES.agents_bucket, NAMES.executions_bucket)]
    streams.append(f"KV_{NAMES.heartbeats_bucket}")
    for stream in streams[i::N]:
        ask = actor.nc.request(
            f"$JS.API.STREAM.INFO.{stream}", b'{"subjects_filter": ">"}', timeout=QUICK
        )
        answer = await quietly(ask)
        if answer is not None and b'"subjects"' in answer.data:
            return True
    return False


@attack(AGENT, "list the subjects of the streams and buckets (stream info)", "permissions")
async def _agent_lists_subjects(arena: Arena, i: int) -> bool:
    return await _lists_subjects(arena.y, i)


@attack(WORKER, "list the subjects of the event and task streams (stream info)", "permissions")
async def _worker_lists_subjects(arena: Arena, i: int) -> bool:
    assert arena.spy is not None
    return await _lists_subjects(arena.spy, i)


@attack(CALLER, "read the registry and heartbeats", "permissions")
async def _caller_reads_registry(arena: Arena, i: int) -> bool:
    bucket = NAMES.agents_bucket
    seen: list[bytes] = []
    sub = await arena.alice_raw.nc.subscribe("$KV.>", cb=_keep(seen))
    direct = await quietly(
        arena.alice_raw.nc.request(f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{X}", b"")
    )
    info = await quietly(arena.alice_raw.js.stream_info(f"KV_{NAMES.heartbeats_bucket}"))
    await settle(arena.alice_raw)
    await sub.unsubscribe()
    return bool(seen) or bool(direct and direct.data) or info is not None


@attack(CALLER, "write cards, heartbeats, a fake agent", "permissions")
async def _caller_writes_registry(arena: Arena, i: int) -> bool:
    written = [
        await _kv_write(arena, arena.alice_raw, NAMES.agents_bucket, X, delete=False),
        await _kv_write(arena, arena.alice_raw, NAMES.heartbeats_bucket, X, delete=False),
        await _kv_write(arena, arena.alice_raw, NAMES.agents_bucket, "fake", delete=False),
    ]
    return any(written)


@attack(CALLER, "read the event stream (other callers' results)", "permissions")
async def _caller_reads_events(arena: Arena, i: int) -> bool:
    return await _reads_events(arena, arena.alice_raw)


@attack(CALLER, "delete or purge REACH_DLQ", "permissions")
async def _caller_wipes_dlq(arena: Arena, i: int) -> bool:
    return await _dlq_wiped(arena, arena.alice_raw)


# -- reply subjects: an answer is the answerer's own write, to wherever the reply names --


async def _heard_while(arena: Arena, subject: str, ask: Callable[[], Awaitable[Any]]) -> list[Any]:
    """What the operator hears on ``subject`` while ``ask`` runs, and in a bounded wait after
    it (``ask`` ends with a request answered in an inbox: its barrier)."""
    sub = await arena.admin.nc.subscribe(subject)
    await arena.admin.nc.flush()
    try:
        await ask()
        await arena.admin.nc.flush()
        heard = []
        while (msg := await quietly(sub.next_msg(timeout=QUICK), QUICK * 2)) is not None:
            heard.append(msg)
        return heard
    finally:
        await sub.unsubscribe()


async def _asked_twice(actor: Broker, subject: str, body: bytes, reply: str) -> None:
    """``actor`` asks with ``reply`` as the reply subject, then the same from its own inbox:
    one subscription of the coordinator takes both in order, so the answer to the second
    leaves after the first would have."""
    await actor.nc.publish(subject, body, reply=reply)
    await actor.nc.request(subject, body, timeout=10)


async def _revision(arena: Arena, bucket: str, key: str) -> int | None:
    entry = await quietly((await arena.admin.js.key_value(bucket)).get(key), 5)
    return entry.revision if entry is not None else None


def _trace_body(arena: Arena) -> bytes:
    assert arena.held is not None  # alice's own message: the trace answer has its events
    return json.dumps({"message_id": arena.held.message_id}).encode()


@attack(CALLER, "trace request whose reply subject is X's card ($KV)", "coordinator")
async def _trace_into_card(arena: Arena, i: int) -> bool:
    card = f"$KV.{NAMES.agents_bucket}.{X}"
    before = await _revision(arena, NAMES.agents_bucket, X)
    ask = NAMES.trace_request("alice"), _trace_body(arena)
    heard = await _heard_while(arena, card, lambda: _asked_twice(arena.alice_raw, *ask, card))
    return bool(heard) or await _revision(arena, NAMES.agents_bucket, X) != before


@attack(CALLER, "call whose reply subject is X's dispatch subject", "coordinator")
async def _call_into_dispatch(arena: Arena, i: int) -> bool:
    call, victim = NAMES.call("summarize", "alice"), NAMES.dispatch(X, "P1")
    body = _task({"n": f"answered-elsewhere-{i}"})
    message_id = json.loads(body)["message_id"]

    async def ask() -> None:
        await arena.alice_raw.nc.publish(call, body, reply=victim)
        await arena.alice_raw.nc.request(call, _task({"n": "barrier"}), timeout=10)
        if await trace_of(arena.admin, message_id):  # taken in: answered once it ends
            await until_true(lambda: _ended(arena, message_id), timeout=10)

    heard = await _heard_while(arena, victim, ask)
    # X's own dispatches pass there too (the barrier's task): anything else is an answer.
    return any((m.headers or {}).get("Reach-Kind") != "task" for m in heard)


async def _ended(arena: Arena, message_id: str) -> bool:
    return any(e.event == "completed" for e in await trace_of(arena.admin, message_id))


@attack(CALLER, "status and trace requests answered to bob's workflow's cancel", "coordinator")
async def _answer_cancels_a_workflow(arena: Arena, i: int) -> bool:
    bob = ReachClient(arena.url, name="bob", auth=arena.deployment.auth("caller", "bob"))
    async with bob:
        instance, _ = await bob.publish(WAITS, {"n": i})

    async def running() -> bool:
        record = await read_record(arena.admin, instance)
        return record is not None and record.status == "running"

    await until_true(running, timeout=10)
    cancel = NAMES.workflow_cancel(instance)

    async def ask() -> None:
        await _asked_twice(arena.alice_raw, NAMES.status, b"", cancel)
        await _asked_twice(
            arena.alice_raw, NAMES.trace_request("alice"), _trace_body(arena), cancel
        )

    heard = await _heard_while(arena, cancel, ask)
    stored = await arena.stored(NAMES.workflows_stream, cancel)
    return bool(heard) or bool(stored) or not await running()


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.attempt.__name__.strip("_"))
async def test_no_attack_succeeds(arena: Arena, attack: Attack) -> None:
    before = arena.violations(attack.actor)
    succeeded = [i for i in range(N) if await attack.attempt(arena, i)]
    await settle(arena.y, arena.alice_raw, *([arena.spy] if arena.spy else []))
    assert succeeded == [], f"{attack.title}: succeeded in attempts {succeeded} of {N}"
    if attack.stopped_by == "permissions":  # the server says so, with the user's key
        assert arena.violations(attack.actor) > before, f"{attack.title}: no violation logged"


async def test_a_workflow_step_ends_only_by_the_agent_it_was_routed_to(arena: Arena) -> None:
    """Y publishes results in its own name to the reply subject of a step given to X (any
    agent may publish as itself there), after a forged `routed` event naming itself: the
    engine looks for the step's routing, refuses each with an alert, and the step ends with
    X's result."""
    instance, _ = await arena.alice.publish("held-flow", {"n": "held step"})
    async with asyncio.timeout(10):
        while {"n": "held step"} not in arena.x_seen:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    stored = await read_stream(arena.admin, P1, NAMES.dispatch(X, "P1"))
    step = envelopes.decode_task(stored[-1].data)
    assert step.reply_to == NAMES.workflow_reply(instance)
    refused: list[str] = []

    async def alert(msg: Any) -> None:
        event = envelopes.decode_event(msg.data)
        if event.detail.get("message_id") == step.message_id:
            refused.append(event.detail.get("kind", ""))

    sub = await arena.admin.nc.subscribe(NAMES.events_of_kind("alert"), cb=alert)
    await arena.admin.nc.flush()
    # First a routing of its own: a `routed` body on a subject Y may publish on.
    forged_routing = _event(step, "routed", Y, marker())
    await arena.y.js.publish(_event_subject(step, "accepted", Y), forged_routing, headers=AS_SENT)
    for _ in range(N):
        forged = _result(step, Y, marker())
        await arena.y.nc.publish(f"{step.reply_to}.{Y}", forged, headers=AS_SENT)
    await arena.y.nc.flush()  # stored: each is gone from the work queue once refused
    forged_subject = f"{step.reply_to}.{Y}"
    async with asyncio.timeout(15):
        while await read_stream(arena.admin, NAMES.workflows_stream, forged_subject):  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # a refusal is seen only as the message's removal
    await sub.unsubscribe()
    # Each refused; a few alerts a minute per sender say so (this module's tests share Y).
    assert set(refused) <= {"result"} and len(refused) <= N
    record = await read_record(arena.admin, instance)
    assert record is not None and record.steps["a"].status == "running"
    arena.release_step.set()
    async with asyncio.timeout(10):
        while (record := await read_record(arena.admin, instance)) and not record.finished:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert record is not None and record.status == "completed"
    assert record.result == {"summary": "real"}


# -- anonymous and forged identities -----------------------------------------------------


async def _refused(arena: Arena, **options: Any) -> bool:
    """Whether the server refuses a connection made with these nats-py options."""
    connection = NATS()
    try:
        await connection.connect(
            arena.url, allow_reconnect=False, connect_timeout=1, max_reconnect_attempts=0, **options
        )
    except Exception:
        return True
    finally:
        await connection.close()  # also the socket of a refused connect
    return False


def _forged_creds(
    path: Path,
    claims_change: Callable[[dict[str, Any]], None],
    *,
    signer: jwt.Key | None = None,
    seed_of: str | None = None,
) -> Path:
    """A creds file whose JWT is another's with its claims changed (re-signed by
    ``signer``, or keeping the original signature), optionally with another user's seed."""
    text = path.read_text()
    token = text.split("-----BEGIN NATS USER JWT-----\n", 1)[1].split("\n", 1)[0]
    seed = text.split("-----BEGIN USER NKEY SEED-----\n", 1)[1].split("\n", 1)[0]
    claims = jwt.claims_of(token)
    claims_change(claims)
    if signer is not None:
        forged = jwt.encode(claims, signer)
    else:  # same signature, other claims
        head, _, signature = token.split(".")
        body = jwt._b64(json.dumps(claims).encode())
        forged = f"{head}.{body}.{signature}"
    out = path.with_name(f"forged-{uuid.uuid4().hex[:6]}.creds")
    user = jwt.Key.from_seed(seed_of or seed)
    jwt.write_creds(out, forged, user)
    return out


async def test_anonymous_and_forged_identities_are_refused(arena: Arena) -> None:
    creds = arena.deployment.directory.creds
    y_creds = creds("agent", Y)
    x_creds = creds("agent", X)
    y_seed = y_creds.read_text().split("-----BEGIN USER NKEY SEED-----\n", 1)[1].split("\n")[0]
    scoped_with_permissions = _forged_creds(
        y_creds,
        lambda c: c["nats"].update({"pub": {"allow": [">"]}, "sub": {"allow": [">"]}}),
        signer=jwt.Key.from_seed(
            (arena.deployment.directory.root / "signing" / "agent.nk").read_text().strip()
        ),
    )
    attempts = {
        "no credentials": {},
        "user and password": {"user": "admin", "password": "admin"},
        "a token": {"token": "s3cret"},
        "a JWT signed by a key the account does not list": {
            "user_credentials": str(
                _forged_creds(y_creds, lambda c: None, signer=jwt.Key.new("account"))
            )
        },
        "Y's JWT renamed to X": {
            "user_credentials": str(_forged_creds(y_creds, lambda c: c.update(name=X)))
        },
        "X's JWT with Y's seed": {
            "user_credentials": str(_forged_creds(x_creds, lambda c: None, seed_of=y_seed))
        },
        "an agent-scoped user carrying its own permissions": {
            "user_credentials": str(scoped_with_permissions)
        },
    }
    for what, options in attempts.items():
        accepted = [i for i in range(N) if not await _refused(arena, **options)]
        assert accepted == [], f"{what}: connected in attempts {accepted}"
    with pytest.raises(AuthenticationFailed, match="Authorization Violation"):
        async with Broker(arena.url, auth=Auth()):
            pass


async def test_the_impersonation_is_an_alert_event(arena: Arena) -> None:
    """An event whose body claims another agent raises an ``alert`` saying who and why, and
    a forged ``completed`` leaves no audit record."""
    task = arena.held
    assert task is not None
    body = _event(task, "completed", X, marker(), result="forged")
    await arena.y.js.publish(_event_subject(task, "completed", Y), body, headers=AS_SENT)

    async def alert() -> bool:
        stored = await read_stream(arena.admin, NAMES.events_stream, "reach.event.alert.>")
        return any(b"impersonation" in m.data and Y.encode() in m.data for m in stored)

    async with asyncio.timeout(10):
        while not await alert():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    # The audit writer raised it, and wrote no record of the lie.
    audit_of_held = NAMES.audit_of_message(task.message_id)
    assert await read_stream(arena.admin, NAMES.audit_stream, audit_of_held) == []


async def test_a_caller_reads_the_trace_of_its_own_tasks_only(arena: Arena) -> None:
    """Callers cannot read REACH_EVENTS; the coordinator answers ``status`` for a caller's
    own messages, with the caller recorded in the trace, and nothing of anyone else's."""
    task = arena.held
    assert task is not None
    own = await arena.alice.status(task.message_id)
    routed = [e for e in own if e.event == "routed"]
    assert routed and routed[0].caller == "alice" and routed[0].agent_id == X
    await arena.alice.invoke("summarize", {"n": "traced"}, trace_id="alice-trace")
    bob = ReachClient(arena.url, name="bob", auth=arena.deployment.auth("caller", "bob"))
    async with bob:
        assert await bob.status(task.message_id) == []
        assert await bob.status("alice-trace") == []
        # A message of bob's named like alice's trace hides nothing of hers, shows nothing.
        mine = await bob.invoke("summarize", {"n": "bob's"}, message_id="alice-trace")
        assert mine == {"summary": "real"}
        by_trace = await arena.alice.status("alice-trace")  # a trace id, not a message id
    assert {e.event for e in by_trace} >= {"routed", "completed"}
    assert {e.trace_id for e in by_trace} == {"alice-trace"}
    assert "alice-trace" not in {e.message_id for e in by_trace}  # not bob's message
    assert await arena.alice.status("*") == []  # a wildcard is no id


async def test_two_callers_runs_of_one_message_id_stay_apart_in_their_traces(arena: Arena) -> None:
    """Past the duplicate window another caller may send a message under an id already used
    (simulated here by sending it without a Nats-Msg-Id): each caller reads only its own
    run, and neither run's events are dropped as duplicates of the other's."""
    shared = f"shared-{marker().decode()}"
    await arena.alice.invoke("summarize", {"n": "alice's"}, message_id=shared)
    bob = ReachClient(arena.url, name="bob", auth=arena.deployment.auth("caller", "bob"))
    async with bob:
        task = bob.task("summarize", {"n": "bob's"}, message_id=shared)
        headers = {k: v for k, v in task_headers(task).items() if k != "Nats-Msg-Id"}
        subject = NAMES.task("summarize", "bob")
        await bob.broker.publish(subject, envelopes.encode(task), headers=headers)
        async with asyncio.timeout(10):
            while not any(e.event == "completed" for e in await bob.status(shared)):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        bobs = await bob.status(shared)
    alices = await arena.alice.status(shared)
    for events, caller in ((alices, "alice"), (bobs, "bob")):
        assert {e.caller for e in events if e.event == "routed"} == {caller}
        assert [e.event for e in events].count("completed") == 1


async def _reach_as(arena: Arena, role: str, name: str, *args: str) -> tuple[int, str, str]:
    """`reach ARGS` as the party ``name`` of ``role``, with nothing but its creds file."""
    creds = arena.deployment.auth(role, name).creds
    argv = [str(reach_command()), *args, "--nats-url", arena.url, "--creds", str(creds)]
    env = {**os.environ, "NATS_URL": "", "NATS_CREDS": ""}
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_a_caller_uses_the_cli_with_its_own_creds(arena: Arena) -> None:
    """`reach publish --wait` and `reach trace` as a caller: the first asks whether a
    coordinator runs, the second asks the coordinator (a caller cannot read REACH_EVENTS)."""
    code, out, err = await _reach_as(
        arena, "caller", "alice", "publish", "summarize", '{"n": "cli"}', "--wait"
    )
    assert code == 0, err
    assert '"summary": "real"' in out and "no coordinator" not in err
    task = arena.held
    assert task is not None
    code, out, err = await _reach_as(arena, "caller", "alice", "trace", task.message_id)
    assert code == 0, err
    assert "routed" in out and "permissions violation" not in err.lower()
    code, out, err = await _reach_as(arena, "caller", "bob", "trace", task.message_id)
    assert code == 1 and "among bob's own messages" in err
    # What only an operator may read is refused at once, saying so (not a timeout).
    operators = (
        ("agents",),
        ("workflows", "list"),
        ("top", "--once"),
        ("dashboard",),
        ("dlq", "list"),
        ("routes", "reload"),
        ("manual", "list"),
        ("provision",),
    )
    for command in operators:
        code, out, err = await _reach_as(arena, "caller", "alice", *command)
        assert code == 1, command
        assert "needs an operator's creds; 'alice' is a caller" in err, command
    # An agent's creds too (provisioning waited without end, as for a leader election), and
    # a coordinator started with them names the role (it asked for a seal key).
    code, out, err = await _reach_as(arena, "agent", X, "provision")
    assert code == 1 and f"needs an operator's creds; {X!r} is an agent" in err, err
    code, out, err = await _reach_as(arena, "agent", X, "coordinator")
    assert code != 0 and f"needs a coordinator's creds; {X!r} is an agent" in err, err
    # Cancelling is a caller's own or an operator's: said as such, not as a read of records.
    code, out, err = await _reach_as(arena, "worker", "fixer", "workflows", "cancel", "wf-1")
    assert code == 1 and "workflows cancel needs an operator's creds; 'fixer' is a worker" in err


async def test_an_agent_answers_the_coordinators_probes_and_its_own_check(arena: Arena) -> None:
    """An agent has no response permission: it answers probes under `_INBOX_probe`, where
    the coordinator's creds (and its own, for the start-up check) read the answers."""
    async with Broker(arena.url, name="probing", auth=arena.deployment.coordinator) as asks:
        assert await probe(asks, X, connection_s=3, ping_s=3) == ProbeResult(True, True)
    async with Broker(arena.url, name="second-x", auth=arena.deployment.auth("agent", X)) as own:
        assert await Presence(own, X, version="1.0.0", tags={}).someone_else_answers(3) is True


async def test_parties_work_under_their_permissions(arena: Arena) -> None:
    """An agent's sub-task, a compensation worker's replay and a new agent issued (and
    allowed its intents) while the server runs all work with nothing but their own creds."""
    deployment = arena.deployment
    parent, child = Agent("planner", startup_delay=0), Agent("helper", startup_delay=0)

    steps: list[Any] = []

    @parent.handler("plan")
    async def plan(ctx: TaskContext, payload: Any) -> Any:
        sub_task = await ctx.publish("step", {"n": payload["n"]})  # as a caller, itself
        return {"sub_task": sub_task.message_id}

    @child.handler("step")
    async def step(ctx: TaskContext, payload: Any) -> Any:
        steps.append(payload)
        if payload.get("fail"):
            raise PermanentError("bad step")
        return payload["n"] * 2

    replayed: list[str] = []

    async def compensate(letter: envelopes.DeadLetter, compensation: Any) -> None:
        if not replayed:  # once: the replay fails the same way
            replayed.append((await compensation.replay(letter)).message_id)

    worker = CompensationWorker("fixer", compensate, topics=["step"])
    deployment.directory.issue("agent", "planner", intents=("plan",))
    deployment.directory.issue("agent", "helper", intents=("step",))
    await push_allowances(deployment.directory, arena.url)  # the intents they may serve
    async with (
        parent.running(arena.url, auth=deployment.auth("agent", "planner")),
        child.running(arena.url, auth=deployment.auth("agent", "helper")),
        worker.running(arena.url, auth=deployment.auth("worker", "fixer")),
    ):
        sub_task = (await arena.alice.invoke("plan", {"n": 21}))["sub_task"]
        async with asyncio.timeout(10):
            while {"n": 21} not in steps:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        trace = await trace_of(arena.admin, sub_task)
        assert any(e.event == "routed" and e.caller == "planner" for e in trace)
        with pytest.raises(TaskFailed):
            await arena.alice.invoke("step", {"n": 1, "fail": True})
        async with asyncio.timeout(10):
            while not replayed:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    stored = await read_stream(arena.admin, NAMES.events_stream, "reach.event.replayed.>")
    assert any(m.subject.endswith(".fixer") for m in stored)  # recorded as the worker itself
    kept = await read_stream(arena.admin, NAMES.settled_stream, "reach.settled.replayed.>")
    assert [m.subject.rsplit(".", 1)[-1] for m in kept] == ["fixer"]  # as long as the letter


async def test_a_worker_keeps_a_letter_s_state_in_its_own_name_only(arena: Arena) -> None:
    """A worker may record that it settled a letter in REACH_SETTLED, and read whether one
    is settled, but not record it in another party's name."""
    async with Broker(arena.url, name="worker", auth=arena.deployment.auth("worker", "w1")) as w:
        own = NAMES.settled("resolved", "t", "tr-1", "m-1", "w1")
        assert (await quietly(w.js.publish(own, b"{}"))) is not None
        forged = NAMES.settled("resolved", "t", "tr-2", "m-2", "alice")
        assert await quietly(w.js.publish(forged, b"{}")) is None
        read = NAMES.settled_of_message_of_kind("resolved", "tr-1", "m-1")
        assert (await last_message(w, NAMES.settled_stream, read)) is not None
    assert await read_stream(arena.admin, NAMES.settled_stream, forged) == []


async def test_a_caller_over_its_quota_is_rate_limited(arena: Arena) -> None:
    """The quota is the authenticated caller's: ``greedy`` gets 2, then ``rate_limited``."""
    greedy = ReachClient(arena.url, name="greedy", auth=arena.deployment.auth("caller", "greedy"))
    async with greedy:
        for n in range(2):
            assert await greedy.invoke("summarize", {"n": n}) == {"summary": "real"}
        with pytest.raises(Rejected) as refused:
            await greedy.invoke("summarize", {"n": 3})
    assert refused.value.reason == "rate_limited"
    assert refused.value.ending == "refused"  # a caller's own quota leaves no dead letter
    assert refused.value.error.retry_after_ms is not None
    assert refused.value.error.retry_after_ms > 0


async def test_the_coordinator_s_creds_neither_shrink_the_dead_letters_nor_delete_a_store(
    arena: Arena,
) -> None:
    """A smaller limit on REACH_DLQ, REACH_EVENTS, REACH_SETTLED or REACH_AUDIT is a purge
    by another name, and the payload store is a stream like the others: the coordinator's
    permissions refuse both (`reach provision` as an operator updates those streams); the
    streams stay as they were."""
    kept = NAMES.history_streams
    payloads = f"OBJ_{NAMES.payloads_bucket}"
    if (await quietly(arena.admin.js.stream_info(payloads))) is None:
        await arena.admin.js.create_object_store(NAMES.payloads_bucket)
    async with Broker(arena.url, name="coordinator-2", auth=arena.deployment.coordinator) as c:
        for stream in kept:
            config = (await arena.admin.js.stream_info(stream)).config
            config.max_msgs = 1
            assert await quietly(c.js.update_stream(config)) is None
        assert await quietly(c.js.delete_stream(payloads)) is None
    for stream in kept:
        assert (await arena.admin.js.stream_info(stream)).config.max_msgs in (None, -1)
    assert (await arena.admin.js.stream_info(payloads)).config.name == payloads


async def test_the_coordinator_s_creds_neither_purge_nor_edit_the_audit_records(
    arena: Arena,
) -> None:
    """Audit records are the record of every finished message: stolen coordinator creds
    purged REACH_AUDIT and deleted records one by one. Both are refused now (the stream
    denies deletes to anyone; the coordinator may not purge it)."""
    audit = NAMES.audit_stream
    await arena.admin.publish(NAMES.audit("completed", "t", "kept-1", "kept-1"), b"{}")
    before = await arena.stored(audit)
    last = (await arena.admin.js.stream_info(audit)).state.last_seq
    async with Broker(arena.url, name="coordinator-4", auth=arena.deployment.coordinator) as c:
        assert await quietly(c.js.purge_stream(audit)) is None
        assert await quietly(c.js.delete_msg(audit, last)) is None
    assert await arena.stored(audit) == before and len(before) >= 1


async def test_a_coordinator_without_its_seal_key_refuses_a_secured_server(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the seal key a replica checks no agent's events and enforces no allowance:
    on a secured server it failed open, with one warning (and mixed replicas enforced at
    random). It refuses to start, naming the key, unless told `security.unsealed: true`."""
    monkeypatch.delenv(UNSEALED_ENV)
    async with Broker(arena.url, name="coordinator-5", auth=arena.deployment.coordinator) as c:
        with pytest.raises(ConfigError, match=r"no security.seal_key_file.*coordinator\.seal"):
            Coordinator(c, FAST)
        knowingly = msgspec.structs.replace(FAST, security=SecurityConfig(unsealed=True))
        assert Coordinator(c, knowingly).config.security.unsealed


async def test_a_coordinator_provisions_around_the_streams_it_may_not_update(
    arena: Arena,
) -> None:
    """Where REACH_DLQ differs from the topology (an upgrade changed it), a coordinator's
    provisioning says that an operator must update it, and goes on; `reach provision` with
    the operator's creds brings it to the topology."""
    dlq = NAMES.dlq_stream
    config = (await arena.admin.js.stream_info(dlq)).config
    config.description = "changed by hand"
    await arena.admin.js.update_stream(config)
    async with Broker(arena.url, name="coordinator-3", auth=arena.deployment.coordinator) as c:
        with capture_logs() as logs:
            await provision(c, Topology.default(NAMES))
    assert (await arena.admin.js.stream_info(dlq)).config.description == "changed by hand"
    said = [e for e in logs if e.get("stream") == dlq]
    assert said and "run `reach provision` as an operator" in said[0]["event"]
    await provision(arena.admin, Topology.default(NAMES))
    assert (await arena.admin.js.stream_info(dlq)).config.description != "changed by hand"


async def test_a_caller_reusing_another_caller_s_message_id_is_refused_at_once(
    arena: Arena,
) -> None:
    """bob sends his task under the id of alice's message: the stream drops it, and the
    coordinator, asked how it ended, tells bob only that the id is another caller's — not
    alice's result — so bob's invoke is refused at once as `duplicate_id`."""
    await arena.alice.invoke("summarize", {"n": "alice-own"}, message_id="alice-owned-1")
    bob = ReachClient(arena.url, name="bob", auth=arena.deployment.auth("caller", "bob"))
    async with bob:
        with pytest.raises(Rejected) as refused:
            await bob.invoke("summarize", {"n": "bob"}, message_id="alice-owned-1")
        assert await bob.status("alice-owned-1") == []
    assert refused.value.reason == "duplicate_id"
    assert "real" not in refused.value.error.message
