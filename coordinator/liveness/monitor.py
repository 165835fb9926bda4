"""The coordinator's side of liveness: UNKNOWN → ONLINE → SUSPECT → OFFLINE.

Judged on this coordinator's receive time of each heartbeat, never on the agent's clock
(and, between heartbeats, by ``PresenceChecks``). Entering SUSPECT by silence probes the
agent once (plus one retry): the presence subject tells whether its connection still exists
(the server answers "no responders" at once when it does not), the ping whether its task
loop answers. "No responders" is final only when it is still the answer after the time a
client takes to reconnect: after a server restart, a live agent is absent from the server
until its reconnect backoff has run. A restarted coordinator gives every agent one offline
threshold of grace instead of declaring them all gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Literal

import structlog

from agentreach.broker import Broker, BrokerError, Change
from agentreach.broker.errors import honour_cancellation, pause
from agentreach.broker.lifecycle import agent_event, emit
from agentreach.broker.presence import ProbeResult, probe
from agentreach.broker.streams import stream_created
from agentreach.broker.tasks import cancel_and_wait
from agentreach.coordinator.liveness.agent_control import tell, tell_refused
from agentreach.coordinator.liveness.cadence import Cadence
from agentreach.coordinator.liveness.config import LivenessConfig
from agentreach.coordinator.liveness.forward import STOPPED, Allowed
from agentreach.coordinator.liveness.presence_checks import PresenceChecks, QueuedSlots
from agentreach.coordinator.liveness.reassign import OFFLINE, UNRESPONSIVE, Moves
from agentreach.coordinator.liveness.tracked import Registered, Tracked, track_registered
from agentreach.coordinator.liveness.verdicts import VerdictWriter
from agentreach.coordinator.routing.run_once import RunOnce
from agentreach.envelopes import (
    AgentControl,
    DecodeError,
    Heartbeat,
    Liveness,
    LivenessState,
    decode_as,
    now_ms,
)

log = structlog.get_logger("coordinator.liveness")

OUTAGE_RESTART_S = 60.0
RESTARTED_AFTER_OUTAGE = "restarted after an outage"


class LivenessMonitor:
    """Follows heartbeats, sweeps for silence, probes, and records each transition."""

    def __init__(
        self,
        broker: Broker,
        config: LivenessConfig,
        registered: Registered | None = None,
        queued: QueuedSlots | None = None,
        run_once: RunOnce | None = None,  # reads execution records (sealed, when secured)
        allowed: Allowed | None = None,  # the attempts a task taken from an agent gets
        probes: Broker | None = None,  # the connection probes go through (default: broker)
    ) -> None:
        self._broker, self._probes = broker, probes or broker
        self._config = config
        self._registered = registered
        self._cards_version = -1  # of the cards last looked through for agents not tracked
        self.agents: dict[str, Tracked] = {}
        # The queues of OFFLINE agents, and of forgotten ones: nobody else takes them.
        run_once = run_once or RunOnce(broker)
        self.moves = Moves(
            broker, run_once, judged=self.agents, registered=registered, queued=queued,
            allowed=allowed,
        )  # fmt: skip
        self._verdicts = VerdictWriter(broker)
        self._checks = PresenceChecks(
            broker,
            config,
            self.agents,
            queued,
            judge=self._transition,
            look_again=self._look_again,
            answered=lambda tracked: self._verdicts.put(tracked.record(), None),
            probes=self._probes,
        )
        self._verdicts_made: object = None  # when the verdicts' bucket was made, as last seen
        self.active = False  # judging now: this replica holds the liveness lease

    async def run(self) -> None:
        self.active = True
        try:
            await self._judge()
        finally:
            self.active = False

    async def _judge(self) -> None:
        await self._verdicts.forget()  # an earlier term's, unwritten: the restore reads KV
        await self._restore()
        heartbeats = await self._broker.bucket(self._broker.names.heartbeats_bucket, Heartbeat)
        writer = asyncio.create_task(self._verdicts.run(), name="liveness-verdicts")
        sweeper = asyncio.create_task(self._sweep_forever(), name="liveness-sweep")
        rereader = asyncio.create_task(self._reread_forever(), name="liveness-reread")
        checks = asyncio.create_task(self._checks.run(), name="liveness-presence-checks")
        try:
            async with heartbeats.watch() as watch:
                remade = 0
                async for change in watch:
                    if watch.remade != remade:  # the store came back empty: verdicts too
                        remade = watch.remade
                        self._write_verdicts_again()
                    # What the watch replays at start was written before: judge it by its age.
                    await self._on_heartbeat(change, replayed=not watch.initial.is_set())
                    honour_cancellation()
        finally:
            probes = [t.probe for t in self.agents.values() if t.probe and not t.probe.done()]
            await cancel_and_wait(sweeper, rereader, checks, *probes)
            await cancel_and_wait(writer)  # after the judges: it writes what they queued

    def _write_verdicts_again(self) -> None:
        """Every verdict, written again: a bucket made again holds none, and its agents read
        UNKNOWN (`reach agents`, the routing's view) until their next transition."""
        log.warning("the heartbeats' bucket was made again; writing every verdict again")
        for tracked in self.agents.values():
            self._verdicts.put(tracked.record(), None)

    async def reread(self) -> None:
        """Read every heartbeat again: a watch can stall after a broker failover, and a
        heartbeat it missed must not make a live agent look silent."""
        heartbeats = await self._broker.bucket(self._broker.names.heartbeats_bucket, Heartbeat)
        for entry in (await heartbeats.snapshot()).values():
            await self._on_beat(entry.key, entry.revision, entry.value, entry.written_ms)

    async def _reread_forever(self) -> None:
        while True:
            await pause(self._config.heartbeat_reread_s)  # the re-read's own period
            try:
                await self.reread()
            except BrokerError as exc:
                log.warning("heartbeat re-read failed", error=str(exc))

    async def clear(self, agent_id: str) -> Literal["cleared", "not quarantined", "unknown agent"]:
        """Lift an agent's quarantine (``reach agents clear``); what there was to lift."""
        tracked = self.agents.get(agent_id)
        if tracked is None:
            return "unknown agent"
        if not tracked.quarantined:
            return "not quarantined"
        tracked.quarantined = False
        tracked.offline_at_ms = []
        await self._transition(tracked, tracked.state, "cleared by an operator")
        return "cleared"

    # -- inputs -------------------------------------------------------------------
    async def _restore(self) -> None:
        """Rebuild from KV; every agent starts with a full offline threshold of grace."""
        verdicts = await self._broker.bucket(self._broker.names.liveness_bucket, Liveness)
        try:
            restored = await verdicts.snapshot()
            made = await stream_created(self._broker, f"KV_{verdicts.name}")
        except BrokerError as exc:
            log.warning("liveness verdicts not restored", error=str(exc))
            return
        if self._verdicts_made not in (None, made):  # the store came back empty
            self._write_verdicts_again()
        self._verdicts_made = made
        for key, entry in restored.items():
            self.agents[key] = Tracked.restored(key, entry.value)

    async def _on_heartbeat(self, change: Change, *, replayed: bool = False) -> None:
        if change.value is None:  # deleted by an agent that stopped cleanly
            await self._on_beat(change.key, change.revision, None)
            return
        try:
            beat = decode_as(change.value, Heartbeat)
        except DecodeError as exc:  # judged as silent: no beat it could use came
            log.warning("ignoring unreadable heartbeat", agent_id=change.key, error=str(exc))
            return
        written_ms = change.written_ms if replayed else 0
        await self._on_beat(change.key, change.revision, beat, written_ms)

    async def _on_beat(
        self, agent_id: str, revision: int, beat: Heartbeat | None, written_ms: int = 0
    ) -> None:
        """A heartbeat at ``revision``, or None when the key was deleted; ``written_ms`` (the
        broker's time) is given for one written before it was read, to judge its age."""
        if beat is not None and beat.agent_id != agent_id:
            log.warning("ignoring a heartbeat naming another agent", agent_id=agent_id,
                        named=beat.agent_id)  # fmt: skip
            return
        tracked = self.agents.get(agent_id)
        if tracked is not None and tracked.has_seen(revision, beat):
            return  # seen already (the periodic re-read finds mostly these)
        if tracked is not None:
            tracked.revision, tracked.seq = revision, beat.seq if beat is not None else 0
        if beat is None:
            if tracked is not None and tracked.state != "OFFLINE":
                await self._transition(tracked, "OFFLINE", "stopped")
            return
        # A heartbeat read at start (after a restart or a lease hand-over) may be an old one
        # of an agent long gone: it counts from when it was written, not from now.
        age_s = max(0, now_ms() - written_ms) / 1000 if written_ms else 0.0
        if age_s > 3 * beat.interval_s:
            if tracked is None:
                last_seen = time.monotonic() - age_s
                tracked = self.agents[agent_id] = Tracked(agent_id, beat.interval_s, last_seen)
                tracked.revision = revision
            # The last process and its interval, as its last beat says: a restored verdict is
            # older after a restart of the agent that made no transition (none was written).
            tracked.epoch, tracked.interval_s = beat.epoch, beat.interval_s
            return
        if tracked is None:
            tracked = self.agents[agent_id] = Tracked(
                agent_id=agent_id,
                interval_s=beat.interval_s,
                last_seen=time.monotonic(),
                revision=revision,
            )
        tracked.last_seen = time.monotonic()
        tracked.interval_s, tracked.in_flight = beat.interval_s, beat.in_flight
        if 0 < tracked.epoch < beat.epoch and tracked.state != "OFFLINE":
            # Its process died unannounced and another came before it was judged: a crash
            # too (an outside trial: one killed every 19 s was never OFFLINE, nor quarantined).
            await self._transition(tracked, "OFFLINE", self._restart_reason())
        # After it: the new process's card, tracked meanwhile, starts its tracking afresh.
        if tracked.cadence is None or beat.epoch != tracked.epoch:
            tracked.cadence = Cadence(beat.interval_s, self._config.adaptive_beats)
            # Its first beat: it listens to control messages now (not yet at its card write).
            if self._registered is not None:
                refusals = self._registered.refused.get(agent_id, {})
                await tell_refused(self._broker, agent_id, refusals)
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
        await tell(self._broker, tracked.agent_id, AgentControl(heartbeat_interval_s=interval_s))

    # -- sweeping -----------------------------------------------------------------
    async def _sweep_forever(self) -> None:
        reconnects = self._broker.reconnects
        while True:
            await pause(self._config.tick_s)  # the sweep's own period
            if not self._broker.connected:
                continue  # our own outage says nothing about the agents
            if self._broker.reconnects != reconnects:
                reconnects = self._broker.reconnects
                self._grace()
            try:
                await self.sweep()
            except BrokerError as exc:  # a dead sweep would judge nobody again
                log.warning("liveness sweep cut short", error=str(exc))

    async def sweep(self) -> None:
        """Judge every agent silent for longer than its thresholds allow."""
        self._track_registered()
        overdue = self._overdue()
        if overdue:
            await self._look_again(overdue)
        for tracked in overdue:
            await self._judge_silent(tracked)
        await self.moves.sweep()

    def _track_registered(self) -> None:
        if self._registered is None or self._registered.version == self._cards_version:
            return
        self._cards_version = self._registered.version
        interval_s = self._config.first_heartbeat_interval_s
        track_registered(self.agents, self._registered.cards, interval_s)

    def _overdue(self) -> list[Tracked]:
        """The agents whose silence asks for a judgement now: a plain scan, no await per
        agent (100,000 agents are swept every tick)."""
        now = time.monotonic()
        return [
            tracked
            for tracked in self.agents.values()
            if (tracked.state in ("ONLINE", "UNKNOWN", "SUSPECT"))
            and now - tracked.last_seen > 3 * tracked.interval_s
        ]

    async def _look_again(self, overdue: list[Tracked]) -> None:
        """Read the heartbeats of agents about to be judged, in batches: a watch may have
        missed them (stalled after a failover, or behind), and a heartbeat it missed must
        not make a live agent look silent."""
        about_to_suspect = [t.agent_id for t in overdue if t.state in ("ONLINE", "UNKNOWN")]
        if not about_to_suspect:
            return
        heartbeats = await self._broker.bucket(self._broker.names.heartbeats_bucket, Heartbeat)
        try:
            found = await heartbeats.current(about_to_suspect)
        except BrokerError as exc:
            log.warning("heartbeats not read again before judging", error=str(exc))
            return
        for entry in found.values():
            await self._on_beat(entry.key, entry.revision, entry.value, entry.written_ms)

    def _grace(self) -> None:
        """After this replica's connection came back, heartbeats missed meanwhile were not
        the agents' fault: each gets a full threshold again, as after a restart."""
        now = time.monotonic()
        for tracked in self.agents.values():
            if tracked.state != "OFFLINE":
                tracked.last_seen = max(tracked.last_seen, now)

    async def _judge_silent(self, tracked: Tracked) -> None:
        silent_for = time.monotonic() - tracked.last_seen
        if tracked.state in ("ONLINE", "UNKNOWN") and silent_for > 3 * tracked.interval_s:
            tracked.connected = False
            await self._transition(tracked, "SUSPECT", "missed heartbeats")
            tracked.probe = asyncio.create_task(self._probe(tracked))
        elif tracked.state == "SUSPECT" and (tracked.probe is None or tracked.probe.done()):
            limit = self._config.unresponsive_intervals if tracked.connected else 5
            if silent_for > limit * tracked.interval_s:
                await self._transition(tracked, "OFFLINE", f"no heartbeat for {limit} intervals")

    async def _probe(self, tracked: Tracked) -> None:
        """Probe once, and once more for a connection not found (the agent may be
        reconnecting); never more per SUSPECT episode."""
        try:
            await self._probe_episode(tracked)
        except BrokerError as exc:  # the sweep judges by silence alone from here on
            log.warning("probe failed", agent_id=tracked.agent_id, error=str(exc))

    async def _probe_episode(self, tracked: Tracked) -> None:
        found = await self._probe_once(tracked)
        # Connected and answering nothing, after 3 silent intervals, is unresponsive at once:
        # a second probe took 8 s more, its queued tasks waiting (+23 s in a drill).
        if found is not None and not found.connected:  # gone, or reconnecting after an outage?
            await asyncio.sleep(self._config.probe_retry_s)  # the reconnect window itself
            found = await self._probe_once(tracked)
        if found is None:
            return  # a heartbeat came meanwhile
        if found.answers:
            tracked.connected = True
            await self._transition(tracked, "SUSPECT", "slow")
        elif found.connected:
            tracked.connected = True
            await self._transition(tracked, "SUSPECT", "unresponsive")
            with contextlib.suppress(BrokerError):
                await emit(
                    self._broker, agent_event(tracked.agent_id, "alert", problem="unresponsive")
                )
        else:
            await self._transition(tracked, "OFFLINE", "connection gone")

    async def _probe_once(self, tracked: Tracked) -> ProbeResult | None:
        """What one probe finds, or None when the agent is no longer SUSPECT."""
        if tracked.state != "SUSPECT":
            return None
        found = await probe(
            self._probes,
            tracked.agent_id,
            connection_s=self._config.probe_connection_s,
            ping_s=self._config.probe_ping_s,
        )
        return found if tracked.state == "SUSPECT" else None

    # -- transitions --------------------------------------------------------------
    async def _transition(self, tracked: Tracked, state: LivenessState, reason: str) -> None:
        # The process judged: a new one's card may be tracked while the verdict is written
        # (a chaos run moved the queue of the new process, which ran its tasks twice).
        before, epoch = tracked.state, tracked.epoch
        tracked.state, tracked.reason, tracked.since_ms = state, reason, now_ms()
        if state == "OFFLINE" and reason not in ("stopped", RESTARTED_AFTER_OUTAGE):
            tracked.went_offline(self._config.flapping_limit)
        log.info("liveness", agent_id=tracked.agent_id, state=state, was=before, reason=reason)
        event = agent_event(
            tracked.agent_id,
            "agent_state",
            state=state,
            was=before,
            reason=reason,
            quarantined=tracked.quarantined,
        )
        self._verdicts.put(tracked.record(), event)
        if state == "OFFLINE" or (state, reason) == ("SUSPECT", "unresponsive"):
            # Written before the queue moves: routing reads it, and must not send tasks back.
            await self._verdicts.written(self._broker.request_timeout)
            why = {"stopped": STOPPED, "unresponsive": UNRESPONSIVE}.get(reason, OFFLINE)
            await self.moves.move(tracked.agent_id, epoch, why=why)

    def _restart_reason(self) -> str:
        """A new process whose last one went unannounced: ``restarted``, counted toward its
        quarantine; not counted within OUTAGE_RESTART_S of this replica's reconnect, as its
        last process may have stopped in the outage, unable to say so (an outside trial:
        four SIGTERMs in outages quarantined an agent)."""
        back_s = time.monotonic() - self._broker.link.back_at
        after_outage = self._broker.reconnects > 0 and back_s < OUTAGE_RESTART_S
        return RESTARTED_AFTER_OUTAGE if after_outage else "restarted"
