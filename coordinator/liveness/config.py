"""How the coordinator judges agents' liveness: its ``liveness:`` settings."""

from __future__ import annotations

from typing import Annotated

import msgspec

from agentreach.coordinator.units import Positive, PositiveSeconds

# Intervals without a heartbeat after which it is late: more than one interval and its jitter.
PastJitter = Annotated[float, msgspec.Meta(gt=1.2)]


class LivenessConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How agents are judged: SUSPECT after 3 heartbeat intervals, OFFLINE after 5 or a
    failed probe; registrations are rate limited per coordinator replica."""

    tick_s: PositiveSeconds = 1.0  # how often silence is looked for
    # A registered agent is judged by this interval until its first heartbeat gives its own:
    # a process that died between registering and beating must not keep its queue forever.
    first_heartbeat_interval_s: PositiveSeconds = 15.0
    # Every heartbeat read again, in case the watch missed an agent's first ones (the ones
    # of agents about to be judged are read again at each sweep).
    heartbeat_reread_s: PositiveSeconds = 300.0
    adaptive_beats: Positive = 20  # beats before an interval goes back, or an idle one doubles
    probe_connection_s: PositiveSeconds = 3.0
    probe_ping_s: PositiveSeconds = 5.0
    # Before the retry of a probe that found no connection: how long a live client may be
    # away while it reconnects. Both SDKs wait at most 2 s between tries, as NATS clients do
    # by default (nats.go, nats.js); the rest is a connect to a server still starting.
    probe_retry_s: PositiveSeconds = 7.0
    # Between heartbeats, the presence of each agent holding work (or whose heartbeat is
    # ``late_intervals`` old) is checked this often, at most so many checks started per tick:
    # a killed agent is found within about ``presence_check_s + probe_retry_s``.
    presence_check_s: PositiveSeconds = 2.0
    presence_checks_per_tick: Positive = 100
    late_intervals: PastJitter = 1.5
    flapping_limit: Positive = 3  # OFFLINE more often than this in an hour: quarantined
    # A SUSPECT agent whose connection is there but that does not heartbeat (stuck, or a
    # wildcard subscriber answering nothing in its place) goes OFFLINE after this many.
    unresponsive_intervals: Positive = 20
    registration_rate: PositiveSeconds = 20.0  # per second, per coordinator replica
    registration_burst: Positive = 20
