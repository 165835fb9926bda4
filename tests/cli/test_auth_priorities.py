"""``reach auth caller --priorities`` / ``reach auth allow --priorities``: which priorities
each party's tasks may have, recorded in the auth directory, shown, and written by ``reach
auth push`` to the allowances bucket of a real secured server."""

from __future__ import annotations

import json

import pytest

from agentreach.broker import Broker
from agentreach.broker.streams import last_message
from agentreach.coordinator.routing.allowances import bucket_name
from tests.cli.test_auth import reach_auth
from tests.secured import SecuredDeployment, secured_server


async def test_priorities_are_recorded_changed_shown_and_pushed(tmp_path):
    """A new caller may send P1,P2; --priorities and `allow` change it; list and show say
    it; push writes `priorities.<name>` for every party and drops a revoked one's."""
    deployment = SecuredDeployment(tmp_path / "auth")
    root = deployment.directory.root
    bulk = await reach_auth(root, "caller", "bulk")
    assert bulk.returncode == 0, bulk.stderr
    assert "bulk may send: P1,P2  (run `reach auth push` to apply it)" in bulk.stdout
    pager = await reach_auth(root, "caller", "pager", "--priorities", "P0,P1,P2")
    assert "pager may send: P0,P1,P2" in pager.stdout
    agent = await reach_auth(root, "agent", "w-1", "--intents", "summarize")
    assert "w-1 may serve: summarize" in agent.stdout and "w-1 may send: P0,P1,P2" in agent.stdout
    both = await reach_auth(root, "allow", "w-1", "--intents", "x", "--priorities", "P1")
    assert "w-1 may serve: x" in both.stdout and "w-1 may send: P1" in both.stdout
    listed = (await reach_auth(root, "list")).stdout
    assert "bulk  priorities: P1,P2" in listed
    assert "w-1  intents: x  priorities: P1" in listed
    shown = (await reach_auth(root, "show", "pager")).stdout
    assert "pager (caller; may send: P0,P1,P2; key U" in shown
    async with secured_server(deployment, tmp_path / "server") as server:
        pushed = await reach_auth(root, "push", "--nats-url", server.url)
        assert pushed.returncode == 0, pushed.stderr
        assert "  priorities.bulk: P1,P2" in pushed.stdout
        assert "  priorities.pager: P0,P1,P2" in pushed.stdout
        again = await reach_auth(root, "push", "--nats-url", server.url)
        assert "pushed the allowances: 0 changed" in again.stdout  # nothing new: nothing written
        assert (await reach_auth(root, "revoke", "bulk")).returncode == 0
        revoked = await reach_auth(root, "push", "--nats-url", server.url)
        assert "priorities.bulk: revoked" in revoked.stdout
        async with Broker(server.url, auth=deployment.admin) as admin:
            kv = await admin.js.key_value(bucket_name(admin.names))
            stored = json.loads((await kv.get("priorities.pager")).value)
            assert stored["sender"] == "pager" and stored["priorities"] == ["P0", "P1", "P2"]
            assert json.loads((await kv.get("w-1")).value)["intents"] == ["x"]
            # Read by its subject: nats-py's kv.keys() said "no keys found" under load (its
            # watcher's end of the initial values raced), in both runs of one CI.
            name = bucket_name(admin.names)
            bulk = await last_message(admin, f"KV_{name}", f"$KV.{name}.priorities.bulk")
            assert bulk is not None and bulk.headers.get("KV-Operation") == "DEL"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("caller", "c-2", "--priorities", "P3"), "--priorities: priority 'P3'"),
        (("caller", "c-2", "--priorities", ""), "--priorities: name at least one"),
        (("revoke", "alice", "--priorities", "P0"), "--priorities is for `auth caller|agent"),
        (("push", "--priorities", "P0"), "--priorities is for"),
        (("allow", "alice"), "auth allow needs --intents"),
        (("allow", "coordinator", "--priorities", "P0"), "it sends no tasks of its own"),
        (("allow", "nobody", "--priorities", "P0"), "'nobody' is no user"),
        (("allow", "alice", "--intents", "x", "--priorities", "P0"), "not an agent"),
    ],
)
async def test_a_wrong_priorities_option_is_one_clear_line(tmp_path, args, said):
    """Each mistake is named on one line, with a non-zero exit and no traceback."""
    deployment = SecuredDeployment(tmp_path / "auth")
    await reach_auth(deployment.directory.root, "caller", "alice")
    wrong = await reach_auth(deployment.directory.root, *args)
    assert wrong.returncode != 0
    assert said in wrong.stderr and "Traceback" not in wrong.stderr
    assert deployment.directory.priorities_of("alice") == ("P1", "P2")  # nothing changed
