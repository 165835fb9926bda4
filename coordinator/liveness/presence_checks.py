"""Presence checks between heartbeats: a dead agent found in seconds, not in five intervals.

A killed process's connection is gone at once, and its presence subject then answers "no
responders" at once; the silence thresholds take 3 intervals to suspect it (45 s with the
default 15 s), time in which its in-flight task expires in its queue and routing keeps
feeding it. So the presence of the agents at risk is asked between heartbeats: every
``presence_check_s``, each agent that holds work (in flight by its last heartbeat, or queued
for it) or whose heartbeat is late (``late_intervals`` without one: past the ±20 % jitter).
At most ``presence_checks_per_tick`` checks start per tick, the agents longest without a sign
of life first: a fleet of 100,000 costs no more than that.

"No responders" makes the agent SUSPECT ("no connection": no new work goes to it); when it
is still the answer ``probe_retry_s`` later, with no heartbeat meanwhile and this coordinator
connected throughout, the agent is OFFLINE ("connection gone") and its tasks are reassigned;
an answer instead makes it ONLINE again ("connection back"). The pause is for a live agent
reconnecting after a server restart, which is absent from the server until its backoff has
run; for the same reason no check starts within ``probe_retry_s`` of this coordinator's own
(re)connection, when every agent may be reconnecting too. A suspicion not settled (no answer in
time, a broker error, an outage meanwhile) is checked again at a later tick.

Only an agent that answered a check in this process of it (epoch), or whose heartbeat is late,
is suspected on "no responders": one that beats without a presence subscription (against the
protocol) must not be judged gone while it beats. A check that times out (a stopped process or
a stuck loop, whose connection stays; or a wildcard subscriber that hears the request and
answers nothing) says the agent is not gone: twice in a row with no heartbeat between, for an
agent holding work, it is SUSPECT `unresponsive` (no new work, an alert), and the silence
thresholds judge it from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from agentreach.broker import Broker, BrokerError
from agentreach.broker.errors import pause
from agentreach.broker.lifecycle import agent_event, emit
from agentreach.broker.presence import present
from agentreach.coordinator.liveness.tracked import Tracked
from agentreach.envelopes import LivenessState

if TYPE_CHECKING:
    from agentreach.coordinator.liveness.config import LivenessConfig

log = structlog.get_logger("coordinator.liveness")

# The SUSPECT reasons a check gives: such an agent is checked again until it is settled.
NO_CONNECTION = "no connection"
UNRESPONSIVE = "unresponsive"  # there, and answering nothing
SETTLED_BY_CHECKS = (NO_CONNECTION, UNRESPONSIVE)  # such a SUSPECT agent is checked again

Judge = Callable[[Tracked, LivenessState, str], Awaitable[None]]
LookAgain = Callable[[list[Tracked]], Awaitable[None]]
QueuedSlots = Callable[[], Iterable[tuple[str, str]]]  # (agent, priority) with tasks queued


@dataclass(frozen=True, slots=True)
class _Seen:
    """What a check started from; any change since makes what it found stale."""

    last_seen: float
    epoch: int
    state: LivenessState
    reason: str
    reconnects: int

    @classmethod
    def now(cls, tracked: Tracked, links: _Links) -> _Seen:
        return cls(
            tracked.last_seen, tracked.epoch, tracked.state, tracked.reason, links.reconnects
        )


class _Links:
    """The connections a check's answer depends on: the coordinator's own, and the one its
    probes go through (another, where a flood of core messages cannot cut the first)."""

    def __init__(self, *brokers: Broker) -> None:
        self._brokers = brokers

    @property
    def connected(self) -> bool:
        return all(broker.connected for broker in self._brokers)

    @property
    def reconnects(self) -> int:
        return sum(broker.reconnects for broker in self._brokers)


class PresenceChecks:
    """Checks the presence of the agents at risk each tick, until cancelled (:meth:`run`)."""

    def __init__(
        self,
        broker: Broker,
        config: LivenessConfig,
        agents: dict[str, Tracked],
        queued: QueuedSlots | None,
        *,
        judge: Judge,
        look_again: LookAgain,
        answered: Callable[[Tracked], None] = lambda tracked: None,
        probes: Broker | None = None,
    ) -> None:
        self._broker, self._probes = broker, probes or broker
        self._links = _Links(broker, self._probes)
        self._config = config
        self._agents = agents
        self._judge = judge  # records a transition (and reassigns on OFFLINE)
        self._look_again = look_again  # reads heartbeats the watch may not have delivered yet
        self._remember = answered  # keeps, in its verdict, that this process answers checks
        self._queued = queued  # the agents with tasks in their dispatch queues, by priority
        self._hold_until = 0.0

    async def run(self) -> None:
        links, reconnects = self._links, self._links.reconnects
        self._hold()  # a judge that just started: agents may be reconnecting to a new server
        async with asyncio.TaskGroup() as checks:
            while True:
                await pause(self._config.tick_s)  # the checks' own period
                if not links.connected:
                    continue  # our own outage: every "no responders" would be ours
                if links.reconnects != reconnects:
                    reconnects = links.reconnects
                    self._hold()
                if time.monotonic() < self._hold_until:
                    continue
                for tracked in self.due():
                    tracked.checking = True
                    checks.create_task(self._check(tracked))

    def _hold(self) -> None:
        """No check starts while live agents may still be reconnecting after an outage."""
        self._hold_until = time.monotonic() + self._config.probe_retry_s

    def due(self) -> list[Tracked]:
        """The agents to check now: at risk, with no sign of life for ``presence_check_s``,
        at most ``presence_checks_per_tick``, the longest without one first. A plain scan
        with no await per agent: it runs every tick over the whole fleet."""
        now, config = time.monotonic(), self._config
        every, late = config.presence_check_s, config.late_intervals
        queued = {agent for agent, _ in self._queued()} if self._queued is not None else set()
        at_risk = [
            tracked
            for tracked in self._agents.values()
            if (
                tracked.in_flight > 0
                or now - tracked.last_seen > late * tracked.interval_s
                or tracked.agent_id in queued
                or tracked.state == "SUSPECT"
            )
            and (tracked.state in ("ONLINE", "UNKNOWN") or tracked.reason in SETTLED_BY_CHECKS)
            and not tracked.checking
            and now - max(tracked.last_seen, tracked.checked_at) >= every
        ]
        return heapq.nsmallest(config.presence_checks_per_tick, at_risk, key=_last_sign)

    async def _check(self, tracked: Tracked) -> None:
        tracked.checked_at = time.monotonic()
        try:
            await self._check_presence(tracked)
        except BrokerError as exc:  # the silence thresholds still judge it
            log.warning("presence check failed", agent_id=tracked.agent_id, error=str(exc))
        finally:
            tracked.checking = False

    async def _check_presence(self, tracked: Tracked) -> None:
        """Ask once; after "no responders", SUSPECT, and ask again once the reconnect window
        has passed. What cannot be settled now (no answer in time, a heartbeat or an outage
        meanwhile, a broker error) is asked again at a later tick."""
        seen = _Seen.now(tracked, self._links)
        answered = await self._ask(tracked)
        if self._stale(tracked, seen):
            return
        if answered is None:  # no answer in time: stuck or stopped, or merely busy
            # Twice in a row, with no heartbeat between: not a moment's hiccup.
            twice, tracked.unanswered_at = tracked.unanswered_at == seen.last_seen, seen.last_seen
            if twice and tracked.state == "ONLINE" and self._holds_work(tracked):
                await self._unanswered(tracked)
            return
        if answered:
            await self._answered(tracked)
            return
        if not self._suspicious(tracked):
            return  # "no responders" does not count against this one
        if tracked.state != "SUSPECT":
            await self._look_again([tracked])  # a heartbeat the watch has not delivered yet
            if self._stale(tracked, seen):
                return
            tracked.connected = False
            await self._judge(tracked, "SUSPECT", NO_CONNECTION)
            seen = _Seen.now(tracked, self._links)
        tracked.probe = asyncio.current_task()
        log.info("no connection; asking again", agent_id=tracked.agent_id, after_s=self._retry_s)
        await asyncio.sleep(self._retry_s)  # the reconnect window itself
        answered = await self._ask(tracked)
        if answered is None or self._stale(tracked, seen):
            return
        if answered:
            await self._answered(tracked)
        else:
            await self._judge(tracked, "OFFLINE", "connection gone")

    def _holds_work(self, tracked: Tracked) -> bool:
        queued = self._queued() if self._queued is not None else ()
        return tracked.in_flight > 0 or any(agent == tracked.agent_id for agent, _ in queued)

    async def _unanswered(self, tracked: Tracked) -> None:
        """An agent holding work whose connection is there and that answered two checks in
        a row with nothing (a stopped process, a blocked loop): it gets no new work from now,
        not after 3 intervals (an idle agent's may be 30 s each, its queued tasks expiring
        meanwhile), and someone is told. A heartbeat makes it ONLINE again; the silence
        thresholds take it OFFLINE (``unresponsive_intervals``)."""
        tracked.connected = True
        await self._judge(tracked, "SUSPECT", UNRESPONSIVE)
        with contextlib.suppress(BrokerError):
            await emit(self._broker, agent_event(tracked.agent_id, "alert", problem=UNRESPONSIVE))

    async def _ask(self, tracked: Tracked) -> bool | None:
        timeout_s = self._config.probe_connection_s
        return await present(self._probes, tracked.agent_id, timeout_s=timeout_s)

    async def _answered(self, tracked: Tracked) -> None:
        if tracked.answered_epoch != tracked.epoch:
            # Kept in its verdict: a replica that takes the judging over (this one died, say,
            # with the agent) counts its "no responders" at once. It waited for 1.5 intervals
            # and a retry, and a dead agent was OFFLINE after 40 s, not 10 (a walkthrough).
            tracked.answered_epoch = tracked.epoch
            self._remember(tracked)
        tracked.unanswered_at = -1.0
        if tracked.state == "SUSPECT":  # of a check: only those are checked
            back = "connection back" if tracked.reason == NO_CONNECTION else "answering again"
            await self._judge(tracked, "ONLINE", back)

    @property
    def _retry_s(self) -> float:
        return self._config.probe_retry_s

    def _suspicious(self, tracked: Tracked) -> bool:
        """Whether "no responders" counts against the agent: it answered before (this very
        process), or its heartbeat is late too."""
        if tracked.answered_epoch == tracked.epoch:
            return True
        silent_s = time.monotonic() - tracked.last_seen
        return silent_s > self._config.late_intervals * tracked.interval_s

    def _stale(self, tracked: Tracked, seen: _Seen) -> bool:
        """Whether what the check found no longer says anything: a heartbeat came, a new
        process of the agent, another judgement, or this coordinator was away meanwhile."""
        return _Seen.now(tracked, self._links) != seen or not self._links.connected


def _last_sign(tracked: Tracked) -> float:
    return max(tracked.last_seen, tracked.checked_at)
