"""The registry of agents in KV: cards, heartbeats, liveness verdicts, registration and
control messages."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from agentreach.envelopes.messages import Event, Priority, Token


class Intent(msgspec.Struct, frozen=True, kw_only=True):
    """One topic an agent serves; ``description`` and ``examples`` say in words what it does,
    so that a request that names no topic can be matched to it (intent resolution)."""

    version: str = "1"
    capacity: Annotated[int, msgspec.Meta(ge=1, description="tasks at once, at least 1")] = 10
    deadline_ms: int | None = None
    max_attempts: int | None = None  # None: the coordinator's default
    description: str = ""
    examples: list[str] = []


class RateLimit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A token bucket: ``rate`` tasks per second sustained, ``burst`` at once."""

    rate: Annotated[float, msgspec.Meta(gt=0)]
    burst: Annotated[int, msgspec.Meta(gt=0)]


class AgentCard(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's record, keyed by ``agent_id``; ``epoch`` rises on every start."""

    v: Literal[1] = 1
    agent_id: Token
    intents: dict[str, Intent]
    tags: dict[str, str] = {}
    host: str = ""
    pid: int = 0
    started_at: int = 0
    epoch: Annotated[int, msgspec.Meta(ge=1, description="rises on every start")] = 1
    # draining: stopping, its running handlers finishing; what it had not started is moved
    status: Literal["running", "draining", "stopped"] = "running"
    rate_limit: RateLimit | None = None  # how fast the coordinator may send it work


MAX_HEARTBEAT_INTERVAL_S = 300.0  # a dead idle agent is found SUSPECT within 3 of them
HeartbeatInterval = Annotated[
    float, msgspec.Meta(gt=0, le=MAX_HEARTBEAT_INTERVAL_S, description="seconds, at most 300")
]


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent writes to ``reach_heartbeats/<agent_id>`` every interval.

    ``agent_time_ms`` is informational: liveness is judged on the coordinator's
    receive time, never on the agent's clock.
    """

    v: Literal[1] = 1
    agent_id: str
    epoch: int
    seq: int
    interval_s: HeartbeatInterval
    in_flight: int = 0
    free_slots: int = 0
    latency_ms: int = 0
    agent_time_ms: int = 0


LivenessState = Literal["UNKNOWN", "ONLINE", "SUSPECT", "OFFLINE"]


class Liveness(msgspec.Struct, frozen=True, kw_only=True):
    """The coordinator's judgement of an agent, in ``reach_liveness/<agent_id>``."""

    v: Literal[1] = 1
    agent_id: str
    state: LivenessState
    since_ms: int
    reason: str = ""
    epoch: int = 0
    interval_s: float = 0.0
    quarantined: bool = False
    offline_at_ms: list[int] = []  # recent OFFLINE transitions, for the flapping cap
    # The epoch whose process answered a presence check (0: none yet): its "no responders"
    # counts at once, on a replica that takes the judging over too.
    answered_epoch: int = 0


class RegisterRequest(msgspec.Struct, frozen=True, kw_only=True):
    """An agent asks a coordinator for a registration slot (rate limited)."""

    agent_id: str


class RegisterReply(msgspec.Struct, frozen=True, kw_only=True):
    """``ok`` false means: too many registrations, try again after ``retry_after_ms``; with
    an ``error``, the request itself is wrong (what it says), and asking again cannot help."""

    ok: bool
    retry_after_ms: int = 0
    heartbeat_interval_s: float | None = None
    error: str | None = None


class TraceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A caller's question on ``reach.ctl.trace.<caller>``: the trace of its message."""

    message_id: str


class Unrouted(msgspec.Struct, frozen=True, kw_only=True):
    """A task stored in the intake (``REACH_TASKS``) that the coordinator has not routed yet,
    so no event of it is recorded. ``stored_ms``: the broker's time of storing it. ``held``:
    the coordinator has taken it in and waits for an agent that can take it; false: it has
    not come to it yet (tasks before it, or no coordinator ran since)."""

    message_id: Token
    trace_id: Token
    topic: Token
    priority: Priority
    stored_ms: int
    held: bool = False


class TraceReply(msgspec.Struct, frozen=True, kw_only=True):
    """The recorded events of the message, oldest first; empty when the message is not the
    asking caller's (or unknown). ``truncated``: the oldest ones (or, with no events, the
    oldest tasks not routed yet) did not fit one reply.
    ``others``: a message of that id exists, but another caller's (the id is taken).
    ``unrouted``: when no event is recorded, the asking caller's tasks of that message or
    trace id that wait in the intake, not routed yet."""

    events: list[Event] = []
    truncated: bool = False
    others: bool = False
    unrouted: list[Unrouted] = []


class AgentControl(msgspec.Struct, frozen=True, kw_only=True):
    """The coordinator's instructions to one agent on ``reach.ctl.agent.<agent_id>``.

    ``refused``: intents of the agent's card the coordinator routes it no task of, each with
    why (its allowance, on a secured deployment), at most ten of them; ``refused_count``: how
    many there are in all."""

    heartbeat_interval_s: float | None = None
    refused: dict[str, str] | None = None
    refused_count: int | None = None
