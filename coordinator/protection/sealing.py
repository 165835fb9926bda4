"""What a replica's seal key changes on its connection: the grants it checks agents'
events against, the Nats-Msg-Id MAC it shares with the other replicas, and the records
only the replicas write, read only as they wrote them. Without a key on a secured
server, it fails closed unless the operator said otherwise."""

from __future__ import annotations

import os

import structlog

from agentreach.broker import Broker
from agentreach.broker.record_seal import RecordSeal, headed_buckets
from agentreach.coordinator.config import ConfigError
from agentreach.coordinator.protection.grants import UNSEALED_ENV, Grants, SecurityConfig

log = structlog.get_logger("coordinator")


def sealed_grants(broker: Broker, security: SecurityConfig) -> Grants:
    """The grants of ``security``'s seal key, with ``broker`` set up to seal as they do."""
    try:
        grants = Grants.from_config(security)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"security.seal_key_file: {exc}") from None
    if broker.auth.identity is not None and not grants.enabled:
        _unsealed(security)
    broker.dedup_secret = broker.dedup_secret or grants.key  # replicas share the key
    if grants.key is not None:
        n = broker.names
        sealed = (n.leases_bucket, n.quotas_bucket, n.workflows_bucket)
        broker.record_seals.update(dict.fromkeys(sealed, RecordSeal(grants.key)))
        broker.headed_buckets.update(headed_buckets(n))
    return grants


def _unsealed(security: SecurityConfig) -> None:
    """On a secured server, no seal key fails closed unless the operator said otherwise: a
    replica without it checks no agent's events, and enforces no allowance."""
    what = (
        "agents' events are not checked against their dispatch's grant, intent and priority"
        " allowances are not enforced, and Nats-Msg-Ids carry no MAC"
    )
    if not (security.unsealed or os.environ.get(UNSEALED_ENV) == "1"):
        raise ConfigError(
            f"secured server but no security.seal_key_file: without it {what}. Give it the key"
            " `reach auth init` made (<auth dir>/coordinator.seal; every replica the same),"
            " or set security.unsealed: true to run so knowingly"
        )
    log.warning(f"secured server, running unsealed: {what}")
