"""Whether the coordinator replicas run one configuration: each names a digest of its own in
its ``reach.ctl.status`` answer. While they differ, what happens to a task depends on which
replica takes it (a trial: 10 of 14 tasks dead-lettered by one replica's rule), and nothing
said so unless someone ran ``reach routes reload``."""

from __future__ import annotations

import hashlib

import msgspec
import structlog

log = structlog.get_logger("coordinator.metrics")


def config_digest(config: msgspec.Struct) -> str:
    """A digest of the configuration as it runs (its routing as last reloaded): the same for
    files that differ only in comments, layout or defaults spelt out."""
    return hashlib.sha256(msgspec.json.encode(config)).hexdigest()


class ConfigDrift:
    """The distinct configurations among the replicas' status answers; a warning each time
    the set of them changes (not when a replica answers late: it would repeat every second).
    A replica that names no digest (an older version, mid-upgrade) counts as one of its own
    beside those that do: it may run anything (a trial's went unseen, quota and all)."""

    def __init__(self) -> None:
        self.configs: int | None = None  # distinct digests; None: no replica named one
        self._said: frozenset[str] = frozenset()

    def seen(self, answers: list[bytes]) -> None:
        by_replica = dict(_digests(answers))
        named = {digest for digest in by_replica.values() if digest}
        digests = named | ({UNKNOWN} if named and UNKNOWN in by_replica.values() else set())
        self.configs = len(digests) or None
        if len(digests) > 1 and digests != self._said:
            self._said = frozenset(digests)  # kept through a read a replica answered late
            log.warning(
                "the coordinator replicas run different configurations: a task's fate depends"
                " on which replica takes it; give every replica the same file and version, and"
                " restart the ones that differ",
                replicas={replica: digest[:12] or "(none: an older version)"
                          for replica, digest in sorted(by_replica.items())},
            )  # fmt: skip


UNKNOWN = ""  # the digest of a replica that names none


def _digests(answers: list[bytes]) -> list[tuple[str, str]]:
    """(replica, config digest) of each answer that names a replica; the digest empty when it
    names none (an older version)."""
    found = []
    for answer in answers:
        try:
            status = msgspec.json.decode(answer)
        except msgspec.DecodeError:
            continue
        if not isinstance(status, dict) or not isinstance(replica := status.get("replica"), str):
            continue
        digest = status.get("config_sha256")
        found.append((replica, digest if isinstance(digest, str) else UNKNOWN))
    return found
