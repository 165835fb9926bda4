"""Configuration of what the coordinator tells about itself and keeps for later: metrics and
health (``metrics:``), audit records (``audit:``) and the claim check (``claim_check:``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from agentreach.coordinator.units import Positive

Port = Annotated[int, msgspec.Meta(ge=0, le=65535, description="a TCP port; 0: any free one")]
Days = Annotated[float, msgspec.Meta(gt=0, le=3650)]


class MetricsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Prometheus ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port``.

    ``port`` unset: no endpoint (``reach up`` / ``reach coordinator`` default to 9464, and
    ``--metrics-port`` overrides both). Events are counted either way.
    """

    port: Port | None = None
    host: str = "127.0.0.1"
    # The port is a preference, not a demand: when it is taken (another replica on this
    # host), any free one is served instead and said so. What ``reach up`` does with 9464.
    any_port_if_taken: bool = False
    batch: Positive = 256  # events counted per fetch
    # Topics labelled as themselves (about 190 series each, never removed); more are counted
    # as `_other`: a card may list any number of intents its allowance's pattern admits.
    topic_labels: Positive = 500


class AuditConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One compact record per finished message in ``REACH_AUDIT``, kept ``keep_days``."""

    enabled: bool = True
    keep_days: Days = 30.0
    batch: Positive = 64


class ClaimCheckConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Payloads above ``threshold_bytes`` travel through the Object Store ``reach_payloads``,
    kept ``keep_days`` (so a dead letter can be replayed for as long as it is kept)."""

    threshold_bytes: Positive = 262_144
    keep_days: Days = 30.0
