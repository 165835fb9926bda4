"""The provisioning report: where each stream lives, and what a replica that is not current
may be doing."""

from __future__ import annotations

from nats.js import api

from agentreach.broker import Outcome
from agentreach.broker.provisioned import Change, _provisioned

SECOND_NS = 1_000_000_000


def info(*replicas: dict[str, object]) -> api.StreamInfo:
    """Stream info of an R3 stream led by n1, with these other replicas."""
    return api.StreamInfo.from_response(
        {
            "config": {"name": "REACH_TASKS", "num_replicas": 3},
            "state": {
                "messages": 0,
                "bytes": 0,
                "first_seq": 0,
                "last_seq": 0,
                "consumer_count": 0,
            },
            "cluster": {"name": "reach", "leader": "n1", "replicas": list(replicas)},
        }
    )


def row(*replicas: dict[str, object]) -> str:
    return _provisioned("REACH_TASKS", info(*replicas), Change(Outcome.UNCHANGED)).describe()


def test_a_replica_heard_from_is_catching_up_and_one_unheard_of_is_said_to_be_away():
    """Not current but heard from a moment ago: catching up. Not heard from since the leader
    was elected (active 0), for over 3 s (three of the leader's heartbeats, though the
    server calls it current for 10 s), or counted offline: not current, offline or cut off
    (the server keeps its last lag for it, so a lag alone tells nothing)."""
    live = {"name": "n2", "current": True, "active": SECOND_NS // 4}
    catching_up = {"name": "n2", "current": False, "active": SECOND_NS // 2, "lag": 120}
    never_heard = {"name": "n3", "current": False, "active": 0, "lag": 2}
    silent = {"name": "n3", "current": False, "active": 40 * SECOND_NS, "lag": 2}
    offline = {"name": "n3", "current": False, "active": SECOND_NS, "offline": True}
    killed = {"name": "n3", "current": True, "active": 3 * SECOND_NS + SECOND_NS // 2}
    assert row(live, {"name": "n3", "current": True, "active": 1}).endswith("replicas n2 n3")
    assert row(live, {**catching_up, "name": "n3"}).endswith(
        "leader n1, replicas n2 n3 (n3 catching up)"
    )
    for away in (never_heard, silent, offline, killed):
        assert row(live, away).endswith(
            "leader n1, replicas n2 n3 (n3 not current: offline or cut off?)"
        )
    assert row(catching_up, never_heard).endswith(
        "(n3 not current: offline or cut off?; n2 catching up)"
    )
