"""The coordinator's configuration, read from YAML into a frozen Struct."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
from agentreach.broker.topology import DEFAULT_QUEUE_CAPACITY
from agentreach.coordinator.rules import RoutingConfig
from agentreach.coordinator.workflow_spec import WorkflowSpec
from agentreach.envelopes import Priority, RateLimit
from agentreach.envelopes.types import Token

Positive = Annotated[int, msgspec.Meta(gt=0)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
Ratio = Annotated[float, msgspec.Meta(gt=0, le=1)]


class ConfigError(Exception):
    """The configuration file is missing or wrong; the message names where."""


class QueueConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-agent dispatch queues: a broker-enforced capacity per priority, and watermarks.

    An agent whose queue passes ``high_watermark`` of its capacity gets no new work
    until it is back under ``low_watermark``.
    """

    capacity: dict[Priority, Positive] = {}
    high_watermark: Ratio = 0.8
    low_watermark: Ratio = 0.5
    refresh_s: PositiveSeconds = 0.25  # how often queue depths are read from the broker

    def __post_init__(self) -> None:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark {self.low_watermark} must be below"
                f" high_watermark {self.high_watermark}"
            )

    def capacity_of(self, priority: Priority) -> int:
        return self.capacity.get(priority) or DEFAULT_QUEUE_CAPACITY[priority]

    @property
    def capacities(self) -> dict[Priority, int]:
        return {p: self.capacity_of(p) for p in DEFAULT_QUEUE_CAPACITY}


class BreakerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Circuit breakers per (agent, intent), and isolation of an agent that keeps failing."""

    window_s: PositiveSeconds = 300.0
    error_ratio: Ratio = 0.4
    min_calls: Positive = 10
    open_s: PositiveSeconds = 10.0
    trial_calls: Positive = 3
    trial_timeout_s: PositiveSeconds = 30.0  # trials that never report count as failures
    isolation_failures: Positive = 5  # consecutive failures of one agent across intents


class RateLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Token buckets per topic (at intake) and per agent (overriding the agent's card).

    Over the limit a task waits at most ``wait_s``, then is rejected as ``rate_limited``.
    Each coordinator replica keeps its own buckets.
    """

    topics: dict[str, RateLimit] = {}
    agents: dict[str, RateLimit] = {}
    wait_s: Annotated[float, msgspec.Meta(ge=0)] = 0.1


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Tunables of one coordinator replica (every replica should share them)."""

    prefix: str = "reach"
    intake_batch: Positive = 64
    intake_ack_wait_s: PositiveSeconds = 30.0
    outcome_batch: Positive = 64
    max_attempts: Positive = 3
    attempts_by_topic: dict[str, Positive] = {}
    retry_base_s: PositiveSeconds = 1.0
    retry_cap_s: PositiveSeconds = 30.0
    liveness_tick_s: PositiveSeconds = 1.0
    heartbeat_reread_s: PositiveSeconds = 60.0
    adaptive_beats: Positive = 20  # beats before an interval goes back, or an idle one doubles
    lease_ttl_s: PositiveSeconds = 10.0  # a dead replica's duties move after at most this
    probe_connection_s: PositiveSeconds = 3.0
    probe_ping_s: PositiveSeconds = 5.0
    flapping_limit: Positive = 3  # OFFLINE more often than this in an hour: quarantined
    registration_rate: PositiveSeconds = 20.0  # per second, per coordinator replica
    registration_burst: Positive = 20
    routing: RoutingConfig = RoutingConfig()
    routes_poll_s: PositiveSeconds = 1.0  # how often the config file is checked for changes
    queues: QueueConfig = QueueConfig()
    breakers: BreakerConfig = BreakerConfig()
    rate_limits: RateLimits = RateLimits()
    workflows: dict[Token, WorkflowSpec] = {}  # started by a task on reach.task.<name>

    def attempts_for(self, topic: str, intent_setting: int | None) -> int:
        """How many attempts ``topic`` gets: this config's per-topic value, else the
        intent's own setting on the agent card, else ``max_attempts``."""
        return self.attempts_by_topic.get(topic) or intent_setting or self.max_attempts


def load_config(path: Path | str | None) -> CoordinatorConfig:
    """Decode the YAML file at ``path``, or the defaults when ``path`` is None."""
    if path is None:
        return CoordinatorConfig()
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read coordinator config {path}: {exc.strerror}") from None
    try:
        return (
            msgspec.yaml.decode(raw, type=CoordinatorConfig) if raw.strip() else CoordinatorConfig()
        )
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
