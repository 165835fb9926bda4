"""The coordinator's side of liveness: UNKNOWN → ONLINE → SUSPECT → OFFLINE.

Judged on this coordinator's receive time of each heartbeat, never on the
agent's clock. Entering SUSPECT probes the agent once (plus one retry):
the presence subject tells whether its connection still exists (the server
answers "no responders" at once when it does not), the ping whether its task
loop answers. A restarted coordinator gives every agent one offline threshold
of grace instead of declaring them all gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import msgspec
import nats.errors
import nats.js.errors
import structlog
from agentreach.broker import Broker, BrokerError
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.lifecycle import agent_event, emit, now_ms
from agentreach.broker.tasks import cancel_and_wait
from agentreach.broker.watch import BucketWatch, Change, snapshot
from agentreach.coordinator.adaptive import Cadence
from agentreach.coordinator.config import CoordinatorConfig
from agentreach.coordinator.reassign import reassign_tasks
from agentreach.envelopes import AgentControl, Heartbeat, Liveness, LivenessState

from agentreach import envelopes

log = structlog.get_logger("coordinator.liveness")

_heartbeat = msgspec.json.Decoder(Heartbeat)
_liveness = msgspec.json.Decoder(Liveness)
HOUR_MS = 3_600_000


@dataclass
class Tracked:
    """What the coordinator knows of one agent."""

    agent_id: str
    interval_s: float
    last_seen: float  # monotonic, this process
    state: LivenessState = "UNKNOWN"
    since_ms: int = 0
    reason: str = ""
    epoch: int = 0
    quarantined: bool = False
    offline_at_ms: list[int] = field(default_factory=list)
    connected: bool = False  # a probe found its connection alive during this SUSPECT episode
    revision: int = 0  # of the last heartbeat taken into account
    probe: asyncio.Task[None] | None = None
    cadence: Cadence | None = None

    def record(self) -> Liveness:
        return Liveness(
            agent_id=self.agent_id,
            state=self.state,
            since_ms=self.since_ms,
            reason=self.reason,
            epoch=self.epoch,
            interval_s=self.interval_s,
            quarantined=self.quarantined,
            offline_at_ms=self.offline_at_ms,
        )


class LivenessMonitor:
    """Follows heartbeats, sweeps for silence, probes, and records each transition."""

    def __init__(self, broker: Broker, config: CoordinatorConfig) -> None:
        self._broker = broker
        self._config = config
        self.agents: dict[str, Tracked] = {}

    async def run(self) -> None:
        await self._restore()
        heartbeats = await self._broker.kv(self._broker.names.heartbeats_bucket)
        sweeper = asyncio.create_task(self._sweep_forever(), name="liveness-sweep")
        rereader = asyncio.create_task(self._reread_forever(), name="liveness-reread")
        try:
            async with BucketWatch(heartbeats) as watch:
                async for change in watch:
                    await self._on_heartbeat(change)
                    honour_cancellation()
        finally:
            probes = [t.probe for t in self.agents.values() if t.probe and not t.probe.done()]
            await cancel_and_wait(sweeper, rereader, *probes)

    async def reread(self) -> None:
        """Read every heartbeat again: a watch can stall after a broker failover, and a
        heartbeat it missed must not make a live agent look silent."""
        kv = await self._broker.kv(self._broker.names.heartbeats_bucket)
        for change in await snapshot(kv):
            await self._on_heartbeat(change)

    async def _reread_forever(self) -> None:
        while True:
            await asyncio.sleep(self._config.heartbeat_reread_s)  # the re-read's own period
            try:
                await self.reread()
            except (nats.errors.Error, BrokerError) as exc:
                log.warning("heartbeat re-read failed", error=str(exc) or type(exc).__name__)
            honour_cancellation()

    async def clear(self, agent_id: str) -> bool:
        """Lift an agent's quarantine (``reach agents clear``)."""
        tracked = self.agents.get(agent_id)
        if tracked is None:
            return False
        tracked.quarantined = False
        tracked.offline_at_ms = []
        await self._transition(tracked, tracked.state, "cleared by an operator")
        return True

    # -- inputs -------------------------------------------------------------------
    async def _restore(self) -> None:
        """Rebuild from KV; every agent starts with a full offline threshold of grace."""
        kv = await self._broker.kv(self._broker.names.liveness_bucket)
        with contextlib.suppress(nats.errors.Error, BrokerError):
            for change in await snapshot(kv):
                key = change.key
                with contextlib.suppress(msgspec.DecodeError):
                    record = _liveness.decode(change.value or b"")
                    self.agents[key] = Tracked(
                        agent_id=key,
                        interval_s=record.interval_s or 15.0,
                        last_seen=time.monotonic(),
                        state=record.state,
                        since_ms=record.since_ms,
                        reason=record.reason,
                        epoch=record.epoch,
                        quarantined=record.quarantined,
                        offline_at_ms=list(record.offline_at_ms),
                    )

    async def _on_heartbeat(self, change: Change) -> None:
        tracked = self.agents.get(change.key)
        if tracked is not None and 0 < change.revision <= tracked.revision:
            return  # seen already (the periodic re-read finds mostly these)
        if tracked is not None:
            tracked.revision = change.revision
        if change.value is None:  # deleted by an agent that stopped cleanly
            if tracked is not None and tracked.state != "OFFLINE":
                await self._transition(tracked, "OFFLINE", "stopped")
            return
        try:
            beat = _heartbeat.decode(change.value)
        except msgspec.DecodeError as exc:
            log.warning("ignoring unreadable heartbeat", agent_id=change.key, error=str(exc))
            return
        if tracked is None:
            tracked = self.agents[change.key] = Tracked(
                agent_id=change.key,
                interval_s=beat.interval_s,
                last_seen=time.monotonic(),
                revision=change.revision,
            )
        tracked.last_seen = time.monotonic()
        tracked.interval_s = beat.interval_s
        if tracked.cadence is None or beat.epoch != tracked.epoch:
            tracked.cadence = Cadence(beat.interval_s, self._config.adaptive_beats)
        tracked.epoch = beat.epoch
        recovered = tracked.state == "SUSPECT"
        if tracked.state != "ONLINE":
            await self._transition(tracked, "ONLINE", "heartbeat")
        if recovered:
            await self._ask_interval(tracked, tracked.cadence.after_recovery())
        elif (wanted := tracked.cadence.on_beat(beat.in_flight)) is not None:
            await self._ask_interval(tracked, wanted)

    async def _ask_interval(self, tracked: Tracked, interval_s: float) -> None:
        log.info(
            "asking for a new heartbeat interval", agent_id=tracked.agent_id, interval_s=interval_s
        )
        control = envelopes.encode(AgentControl(heartbeat_interval_s=interval_s))
        with contextlib.suppress(nats.errors.Error):
            await self._broker.nc.publish(
                self._broker.names.agent_control(tracked.agent_id), control
            )

    # -- sweeping -----------------------------------------------------------------
    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._config.liveness_tick_s)  # the sweep's own period
            for tracked in list(self.agents.values()):
                await self._sweep(tracked)
                honour_cancellation()

    async def _sweep(self, tracked: Tracked) -> None:
        silent_for = time.monotonic() - tracked.last_seen
        if tracked.state in ("ONLINE", "UNKNOWN") and silent_for > 3 * tracked.interval_s:
            tracked.connected = False
            await self._transition(tracked, "SUSPECT", "missed heartbeats")
            tracked.probe = asyncio.create_task(self._probe(tracked))
        elif (
            tracked.state == "SUSPECT"
            and not tracked.connected
            and silent_for > 5 * tracked.interval_s
            and (tracked.probe is None or tracked.probe.done())
        ):
            await self._transition(tracked, "OFFLINE", "no heartbeat for 5 intervals")

    async def _probe(self, tracked: Tracked) -> None:
        """Probe once, and once more if needed; never more per SUSPECT episode."""
        try:
            await self._probe_episode(tracked)
        except BrokerError as exc:  # the sweep judges by silence alone from here on
            log.warning("probe failed", agent_id=tracked.agent_id, error=str(exc))

    async def _probe_episode(self, tracked: Tracked) -> None:
        for _ in range(2):
            connected, answers = await self._probe_once(tracked.agent_id)
            if tracked.state != "SUSPECT":
                return  # a heartbeat came meanwhile
            if answers:
                tracked.connected = True
                await self._transition(tracked, "SUSPECT", "slow")
                return
            if not connected:
                continue
        if connected:
            tracked.connected = True
            await self._transition(tracked, "SUSPECT", "unresponsive")
            with contextlib.suppress(Exception):
                await emit(
                    self._broker, agent_event(tracked.agent_id, "alert", problem="unresponsive")
                )
        else:
            await self._transition(tracked, "OFFLINE", "connection gone")

    async def _probe_once(self, agent_id: str) -> tuple[bool, bool]:
        """(is its connection there, does its task loop answer)."""
        names, nc = self._broker.names, self._broker.nc
        try:
            await nc.request(names.presence(agent_id), b"", timeout=self._config.probe_connection_s)
            connected = True
        except nats.errors.NoRespondersError:
            return False, False
        except nats.errors.TimeoutError:
            connected = True  # the subscription exists: only its owner is not answering
        try:
            await nc.request(names.ping(agent_id), b"", timeout=self._config.probe_ping_s)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return connected, False
        return connected, True

    # -- transitions --------------------------------------------------------------
    async def _transition(self, tracked: Tracked, state: LivenessState, reason: str) -> None:
        before = tracked.state
        tracked.state, tracked.reason, tracked.since_ms = state, reason, now_ms()
        if state == "OFFLINE" and reason != "stopped":
            self._count_offline(tracked)
        log.info("liveness", agent_id=tracked.agent_id, state=state, was=before, reason=reason)
        kv = await self._broker.kv(self._broker.names.liveness_bucket)
        with contextlib.suppress(nats.errors.Error):
            await kv.put(tracked.agent_id, envelopes.encode(tracked.record()))
        with contextlib.suppress(Exception):
            await emit(
                self._broker,
                agent_event(
                    tracked.agent_id,
                    "agent_state",
                    state=state,
                    was=before,
                    reason=reason,
                    quarantined=tracked.quarantined,
                ),
            )
        if state == "OFFLINE":
            await reassign_tasks(self._broker, tracked.agent_id)

    def _count_offline(self, tracked: Tracked) -> None:
        now = now_ms()
        tracked.offline_at_ms = [t for t in tracked.offline_at_ms if now - t < HOUR_MS] + [now]
        if len(tracked.offline_at_ms) > self._config.flapping_limit:
            tracked.quarantined = True
