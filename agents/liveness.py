"""The agent's side of liveness: a stable identity, heartbeats, probes and a watchdog.

Heartbeats go to ``reach_heartbeats/<agent_id>`` every interval ± 20 %. The
coordinator judges them on its own receive time; the agent's clock travels
along only as information (and a jump in it is reported as ``clock_drift``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.micro
import structlog
from agentreach.agents.errors import AgentConfigError, ReachError
from agentreach.broker import Broker
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.lifecycle import agent_event, emit
from agentreach.envelopes import AgentControl, Heartbeat
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agentreach import envelopes

log = structlog.get_logger("agents.liveness")

JITTER = 0.2
CLOCK_DRIFT_S = 5.0


class AgentIdInUse(ReachError):
    """Another live process already serves this agent_id."""


def resolve_agent_id(agent_id: str | None, identity_file: Path) -> str:
    """``agent_id`` if given; else the id kept in ``identity_file``, created on first use."""
    if agent_id:
        return agent_id
    try:
        kept = identity_file.read_text().strip()
    except FileNotFoundError:
        kept = ""
    except OSError as exc:
        raise AgentConfigError(f"cannot read identity file {identity_file}: {exc}") from None
    if kept:
        return kept
    generated = f"agent-{uuid.uuid4().hex[:12]}"
    try:
        identity_file.parent.mkdir(parents=True, exist_ok=True)
        identity_file.write_text(generated + "\n")
    except OSError as exc:
        raise AgentConfigError(f"cannot write identity file {identity_file}: {exc}") from None
    return generated


@dataclass(frozen=True, slots=True)
class Load:
    in_flight: int
    free_slots: int
    latency_ms: int


def jittered(interval_s: float, rng: random.Random | None = None) -> float:
    """``interval_s`` ± 20 %, so a fleet started together does not beat in step."""
    return interval_s * (1 + (rng or random).uniform(-JITTER, JITTER))


class Presence:
    """Answers the coordinator's probes while the process lives.

    ``presence`` is a plain subscription: when the process is gone, the server
    answers "no responders" at once. ``ping`` is a NATS micro service endpoint,
    so ``nats micro ls`` lists live agents.
    """

    def __init__(self, broker: Broker, agent_id: str, *, version: str, tags: dict[str, str]):
        self._broker = broker
        self._agent_id = agent_id
        self._version = version
        self._tags = tags
        self._sub: Subscription | None = None
        self._service: Any = None

    async def check_free(self, timeout_s: float) -> None:
        """Refuse to start when another live process answers for this id."""
        try:
            await self._broker.nc.request(
                self._broker.names.presence(self._agent_id), b"", timeout=timeout_s
            )
        except nats.errors.NoRespondersError:
            return
        except nats.errors.TimeoutError:
            pass  # a process holds the id but does not answer: still not ours to take
        raise AgentIdInUse(
            f"agent_id {self._agent_id!r} is in use by another live process;"
            " stop it or start this one with another id"
        )

    async def start(self) -> None:
        nc = self._broker.nc
        self._sub = await nc.subscribe(self._broker.names.presence(self._agent_id), cb=_answer)
        self._service = await nats.micro.add_service(
            nc,
            name="reach-agent",
            version=self._version,
            description=f"Agent-Reach agent {self._agent_id}",
            metadata={"agent_id": self._agent_id, **self._tags},
        )
        await self._service.add_endpoint(
            name="ping", subject=self._broker.names.ping(self._agent_id), handler=_pong
        )

    async def stop(self) -> None:
        """Stop answering; safe to call twice."""
        service, self._service = self._service, None
        sub, self._sub = self._sub, None
        if service is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.stop(), 2.0)
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def _answer(msg: Msg) -> None:
    await msg.respond(b"here")


async def _pong(request: Any) -> None:
    await request.respond(b"pong")


class Heartbeats:
    """Writes a heartbeat every interval ± 20 % and applies the coordinator's instructions."""

    def __init__(
        self,
        broker: Broker,
        agent_id: str,
        epoch: int,
        *,
        interval_s: float,
        load: Callable[[], Load],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._broker = broker
        self._agent_id = agent_id
        self._epoch = epoch
        self.interval_s = interval_s
        self._load = load
        self._clock = clock
        self._seq = 0
        self._wake = asyncio.Event()
        self._last: tuple[float, float] | None = None  # (wall, monotonic) at the last beat

    async def run(self) -> None:
        """Beat until cancelled; a failed write is logged and the next one tried."""
        kv = await self._broker.kv(self._broker.names.heartbeats_bucket)
        control = await self._broker.nc.subscribe(
            self._broker.names.agent_control(self._agent_id), cb=self._on_control
        )
        try:
            while True:
                await self._beat(kv)
                honour_cancellation()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), jittered(self.interval_s))
        finally:
            with contextlib.suppress(Exception):
                await control.unsubscribe()

    async def _beat(self, kv: Any) -> None:
        self._seq += 1
        wall, mono = self._clock(), time.monotonic()
        load = self._load()
        beat = Heartbeat(
            agent_id=self._agent_id,
            epoch=self._epoch,
            seq=self._seq,
            interval_s=self.interval_s,
            in_flight=load.in_flight,
            free_slots=load.free_slots,
            latency_ms=load.latency_ms,
            agent_time_ms=int(wall * 1000),
        )
        try:
            await kv.put(self._agent_id, envelopes.encode(beat))
        except nats.errors.Error as exc:
            log.warning("heartbeat not written", error=str(exc) or type(exc).__name__)
        await self._check_clock(wall, mono)

    async def _check_clock(self, wall: float, mono: float) -> None:
        last, self._last = self._last, (wall, mono)
        if last is None:
            return
        drift = (wall - last[0]) - (mono - last[1])
        if abs(drift) > CLOCK_DRIFT_S:
            log.warning("clock drift", drift_s=round(drift, 3))
            with contextlib.suppress(Exception):
                await emit(
                    self._broker,
                    agent_event(self._agent_id, "clock_drift", drift_s=round(drift, 3)),
                )

    async def _on_control(self, msg: Msg) -> None:
        try:
            control = msgspec.json.decode(msg.data, type=AgentControl)
        except msgspec.DecodeError as exc:
            log.warning("ignoring unreadable control message", error=str(exc))
            return
        if control.heartbeat_interval_s and control.heartbeat_interval_s > 0:
            log.info("heartbeat interval changed", interval_s=control.heartbeat_interval_s)
            self.interval_s = control.heartbeat_interval_s
            self._wake.set()  # beat now, so the coordinator sees the new interval at once


class Watchdog:
    """A thread that notices when the event loop stops turning, and says what holds it.

    A task on the loop stamps a monotonic time every ``tick``; the thread warns
    "heartbeat lag detected" with the loop thread's stack once the stamp is
    older than ``threshold_s``.
    """

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self._tick_s = max(0.01, threshold_s / 4)
        self._stamp = time.monotonic()
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="reach-watchdog", daemon=True)
        self.lags_detected = 0

    async def run(self) -> None:
        self._loop_thread = threading.get_ident()
        self._thread.start()
        try:
            while True:
                self._stamp = time.monotonic()
                await asyncio.sleep(self._tick_s)
        finally:
            self._stop.set()

    def _watch(self) -> None:
        stalled = False
        while not self._stop.wait(self._tick_s):
            lag = time.monotonic() - self._stamp
            if lag > self.threshold_s and not stalled:
                stalled = True
                self.lags_detected += 1
                frame = sys._current_frames().get(self._loop_thread)
                stack = "".join(traceback.format_stack(frame)) if frame else "(no stack)"
                log.warning("heartbeat lag detected", lag_s=round(lag, 3), stack=stack)
            elif lag <= self.threshold_s:
                stalled = False
