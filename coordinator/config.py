"""The coordinator's configuration, read from YAML into a frozen Struct."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

Positive = Annotated[int, msgspec.Meta(gt=0)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]


class ConfigError(Exception):
    """The configuration file is missing or wrong; the message names where."""


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
