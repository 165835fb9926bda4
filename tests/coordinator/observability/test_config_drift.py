"""Which configurations the replicas' status answers name (pure: the answers are given)."""

from __future__ import annotations

import msgspec
from structlog.testing import capture_logs

from agentreach.coordinator.observability.config_drift import ConfigDrift

A, B = "a" * 64, "b" * 64


def _answers(*replicas: tuple[str, str | None]) -> list[bytes]:
    return [
        msgspec.json.encode({"replica": name, **({"config_sha256": sha} if sha else {})})
        for name, sha in replicas
    ]


def test_a_replica_of_an_older_version_counts_as_a_configuration_of_its_own():
    """Mid-upgrade an older replica names no digest: it was left out, and a quota it lacked
    went unseen, no warning, no alert (an upgrade trial)."""
    drift = ConfigDrift()
    with capture_logs() as logs:
        drift.seen(_answers(("new", A), ("old", None)))
    assert drift.configs == 2
    [said] = [line for line in logs if line["event"].startswith("the coordinator replicas run")]
    assert said["replicas"] == {"new": A[:12], "old": "(none: an older version)"}


def test_one_configuration_and_only_older_replicas_are_no_drift():
    drift = ConfigDrift()
    drift.seen(_answers(("one", A), ("two", A)))
    assert drift.configs == 1
    drift.seen(_answers(("old-1", None), ("old-2", None)))
    assert drift.configs is None  # nothing to compare: no gauge


def test_the_same_difference_is_said_once_and_a_new_one_again():
    drift = ConfigDrift()
    with capture_logs() as logs:
        for _ in range(3):
            drift.seen(_answers(("one", A), ("two", B)))
        drift.seen(_answers(("one", A)))  # the other answered late: not a change to say
        drift.seen(_answers(("one", A), ("two", B), ("three", None)))
    said = [line for line in logs if line["event"].startswith("the coordinator replicas run")]
    assert len(said) == 2
