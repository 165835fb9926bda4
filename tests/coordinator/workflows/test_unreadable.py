"""Unreadable workflow messages: their dead letters, against a real nats-server."""

from __future__ import annotations

from agentreach.broker import Broker
from tests.support import Watcher, eventually


async def junk(broker: Broker, instance: str, sender: str, n: int) -> None:
    """``n`` unreadable replies to ``instance`` in ``sender``'s name, each its own message."""
    subject = f"{broker.names.workflow_reply(instance)}.{sender}"
    for i in range(n):
        await broker.publish(subject, b"junk-not-json", headers={"Nats-Msg-Id": f"{sender}-{i}"})


async def test_an_agents_unreadable_replies_get_one_letter_a_minute(
    broker, coordinator, watcher: Watcher
):
    """Any agent may reply under any instance id: 300 replies of junk were 300 letters in
    REACH_DLQ (20 of them a megabyte each), charged to no quota, in a security trial. Each
    sender's unreadable replies get one letter a minute, which says how many were dropped;
    another sender's still get theirs."""
    await junk(broker, "victim-1", "mallory", 20)
    await junk(broker, "victim-1", "trent", 1)  # handled after mallory's: the same instance
    await eventually(lambda: "trent-0" in sent_ids(watcher))
    assert sorted(sent_ids(watcher)) == ["mallory-0", "trent-0"]
    assert all(d.error and "JSON is malformed" in d.error.message for d in watcher.dead_letters)


def sent_ids(watcher: Watcher) -> list[str]:
    """The ids the letters' messages were sent under."""
    return [
        d.headers.get("Nats-Msg-Id", "") for d in watcher.dead_letters if d.topic == "_workflow"
    ]
