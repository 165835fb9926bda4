"""What provisioning did to each stream and bucket, and where each one lives now: its replica
count (before and after a scale), placement tags, leader and the other replicas.

    REACH_TASKS              updated    R1→R3  [sync:always]  leader n2, replicas n1 n3

A replica that is not current is "catching up" while its leader hears from it; one the leader
has not heard from lately (or at all, since it became leader), or that the cluster counts as
offline, is "not current: offline or cut off?": down, or cut off from the others, and it may
stay so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js
from nats.js import api

from agentreach.broker.topology import Outcome

SETTLE_POLL_S = 0.25
# Unheard of for this long, a replica is down or cut off, not catching up: a leader hears
# from each replica at least once a second (its heartbeat, measured), while the server goes
# on counting a killed replica current for 10 s (its lost-quorum interval; a cluster trial's
# `reach provision` said "catching up" of a node killed 3 s before).
SILENT_S = 3.0


@dataclass(frozen=True, slots=True)
class Change:
    """What provisioning did to one stream, and its replica count before, when it scaled it."""

    outcome: Outcome
    replicas_before: int | None = None
    note: str = ""  # what was asked and not done, and why


@dataclass(frozen=True, slots=True)
class Provisioned:
    """One stream or bucket after provisioning."""

    name: str  # the stream's name, or the bucket's (not its KV_ stream)
    outcome: Outcome
    replicas: int
    replicas_before: int | None  # when this run scaled it
    tags: tuple[str, ...]
    leader: str | None
    peers: tuple[str, ...]  # the other replicas
    current: bool  # every replica has caught up with the leader, and is heard from
    lagging: tuple[str, ...] = ()  # replicas not current that the leader hears from
    away: tuple[str, ...] = ()  # replicas the leader does not hear from
    note: str = ""  # what was asked and not done, and why

    def describe(self) -> str:
        scale = f"R{self.replicas_before}→R{self.replicas}" if self.replicas_before else ""
        replicas = scale or f"R{self.replicas}"
        tags = f"[{', '.join(self.tags)}]" if self.tags else "-"
        where = f"leader {self.leader}" if self.leader else ""
        if self.peers:
            where += f", replicas {' '.join(self.peers)}"
        if not self.current:
            where += self._behind() if self.leader else "no leader yet"
        if self.note:
            where += f"{'; ' if where else ''}{self.note}"
        return f"{self.name:<24} {self.outcome:<10} {replicas:<6} {tags:<16} {where}".rstrip()

    def _behind(self) -> str:
        """Which replicas are not current, and why that may be."""
        said = [f"{' '.join(self.away)} not current: offline or cut off?"] if self.away else []
        if self.lagging or not said:  # or replicas not placed yet: none to name
            said.append(" ".join([*self.lagging, "catching up"]))
        return f" ({'; '.join(said)})"

    def fields(self) -> dict[str, object]:
        return {
            "name": self.name,
            "outcome": str(self.outcome),
            "replicas": self.replicas,
            "tags": list(self.tags),
            "leader": self.leader,
            "current": self.current,
            "lagging": list(self.lagging),
            "away": list(self.away),
        }


class Provisioning(Mapping[str, Outcome]):
    """The outcome of each stream and bucket by name, and the details (:attr:`details`)."""

    def __init__(self, details: Sequence[Provisioned], *, replicas: int) -> None:
        self.details = list(details)
        self.replicas = replicas  # what the setting resolved to on this server
        self._outcomes = {item.name: item.outcome for item in self.details}

    def __getitem__(self, name: str) -> Outcome:
        return self._outcomes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._outcomes)

    def __len__(self) -> int:
        return len(self._outcomes)

    def table(self) -> str:
        return "\n".join(item.describe() for item in self.details)


async def wait_settled(
    js: nats.js.JetStreamContext, name: str, stream: str, change: Change, settle_s: float
) -> Provisioned:
    """Where ``stream`` is now; after a creation or an update, once every replica is current
    (or ``settle_s`` has passed)."""
    waits = change.outcome is not Outcome.UNCHANGED
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    while True:
        try:
            info = await js.stream_info(stream)
        except (nats.errors.Error, TimeoutError):
            info = None  # no leader to answer yet
        if info is not None and (_current(info) or not waits or loop.time() > deadline):
            return _provisioned(name, info, change)
        if info is None and (not waits or loop.time() > deadline):
            return Provisioned(
                name, change.outcome, 0, change.replicas_before, (), None, (), False,
                note=change.note,
            )  # fmt: skip
        await asyncio.sleep(SETTLE_POLL_S)  # polling: no event says "replicas current"


def _current(info: api.StreamInfo) -> bool:
    wanted = (info.config.num_replicas or 1) - 1
    cluster = info.cluster
    if cluster is None:
        return wanted == 0
    peers = cluster.replicas or []
    return bool(cluster.leader) and len(peers) == wanted and all(_caught_up(p) for p in peers)


def _caught_up(peer: api.PeerInfo) -> bool:
    return bool(peer.current) and not _away(peer)


def _provisioned(name: str, info: api.StreamInfo, change: Change) -> Provisioned:
    config, cluster = info.config, info.cluster
    placement = config.placement
    behind = [p for p in (cluster.replicas or []) if not _caught_up(p)] if cluster else []
    return Provisioned(
        name=name,
        outcome=change.outcome,
        replicas=config.num_replicas or 1,
        replicas_before=change.replicas_before,
        tags=tuple(placement.tags or ()) if placement is not None else (),
        # A single server names itself leader of everything: worth saying only in a cluster.
        leader=cluster.leader if cluster is not None and cluster.name else None,
        peers=tuple(sorted(p.name or "?" for p in (cluster.replicas or []))) if cluster else (),
        current=_current(info),
        lagging=tuple(sorted(p.name or "?" for p in behind if not _away(p))),
        away=tuple(sorted(p.name or "?" for p in behind if _away(p))),
        note=change.note,
    )


def _away(peer: api.PeerInfo) -> bool:
    """Not heard from by the leader lately (``active``: how long ago; 0 when never since it
    became leader, said only of one not current), or counted offline: down or cut off, not
    catching up, though the server may still count it current."""
    heard_s = (peer.active or 0) / 1e9  # the server reports nanoseconds
    never = heard_s == 0 and not peer.current
    return bool(peer.offline) or never or heard_s > SILENT_S
