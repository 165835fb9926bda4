"""``reach auth agent --intents`` / ``reach auth allow``: what each agent may serve, recorded
in the auth directory and written by ``reach auth push`` to the allowances bucket of a real
secured server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentreach.broker import Broker
from agentreach.broker.streams import last_message
from agentreach.coordinator.routing.allowances import Allowance, allows, bucket_name, parse, refused
from agentreach.envelopes import AgentCard, Intent
from tests.cli.test_auth import reach_auth
from tests.secured import SecuredDeployment, secured_server


async def test_intents_are_recorded_changed_shown_and_pushed(tmp_path):
    """A new agent without --intents serves nothing; --intents and `allow` set what it
    serves; re-issuing keeps it; push writes each agent's allowance, a revoked one's as revoked."""
    deployment = SecuredDeployment(tmp_path / "auth")
    root = deployment.directory.root
    made = await reach_auth(root, "agent", "summarizer-1", "--intents", "summarize, sum*")
    assert made.returncode == 0, made.stderr
    assert "summarizer-1 may serve: summarize,sum*" in made.stdout
    bare = await reach_auth(root, "agent", "newcomer")
    assert "newcomer may serve: nothing" in bare.stdout
    assert (await reach_auth(root, "allow", "newcomer", "--intents", "translate")).returncode == 0
    again = await reach_auth(root, "agent", "newcomer")  # new creds, same allowance
    assert "newcomer may serve: translate" in again.stdout
    listed = (await reach_auth(root, "list")).stdout
    assert "newcomer  intents: translate" in listed
    assert (
        "(agent; may serve: summarize,sum*; may send: P0,P1,P2; key U"
        in (await reach_auth(root, "show", "summarizer-1")).stdout
    )
    async with secured_server(deployment, tmp_path / "server") as server:
        pushed = await reach_auth(root, "push", "--nats-url", server.url)
        assert pushed.returncode == 0, pushed.stderr
        assert "pushed the allowances: 5 changed" in pushed.stdout  # 2 intents, 3 priorities
        assert (await reach_auth(root, "revoke", "newcomer")).returncode == 0
        assert (
            "newcomer: revoked" in (await reach_auth(root, "push", "--nats-url", server.url)).stdout
        )
        async with Broker(server.url, auth=deployment.admin) as admin:
            kv = await admin.js.key_value(bucket_name(admin.names))
            stored = json.loads((await kv.get("summarizer-1")).value)
            assert stored["intents"] == ["summarize", "sum*"]
            name = bucket_name(admin.names)  # by its subject: kv.keys() is racy under load
            kept = await last_message(admin, f"KV_{name}", f"$KV.{name}.newcomer")
            assert kept is not None and json.loads(kept.data)["revoked"] is True
        card = AgentCard(agent_id="newcomer", intents={"translate": Intent()})
        revoked = Allowance(**json.loads(kept.data))
        assert refused(card, revoked) == {
            "translate": "newcomer is revoked (`reach auth revoke`): its creds no longer connect"
        }


async def test_an_agent_issued_before_allowances_keeps_serving_any_intent(tmp_path):
    """A registry entry without intents (made by an earlier version) is pushed as ``*``."""
    deployment = SecuredDeployment(tmp_path / "auth")
    deployment.directory.issue("agent", "old-timer")
    registry_path = deployment.directory.root / "registry.json"
    registry = json.loads(registry_path.read_text())
    del registry["users"]["old-timer"]["intents"]
    registry_path.write_text(json.dumps(registry))
    assert deployment.directory.allowances() == {"old-timer": ("*",)}
    listed = await reach_auth(deployment.directory.root, "list")
    assert "old-timer  intents: *" in listed.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("allow", "alice", "--intents", "x"), "a caller, not an agent"),
        (("caller", "bob", "--intents", "x"), "--intents is for `auth agent` and `auth allow`"),
        (("agent", "w-1", "--intents", "sum.mary"), "intent pattern 'sum.mary'"),
        (("allow", "w-1"), "auth allow needs --intents"),
    ],
)
async def test_a_wrong_intents_option_is_one_clear_line(tmp_path, args, said):
    deployment = SecuredDeployment(tmp_path / "auth")
    root: Path = deployment.directory.root
    await reach_auth(root, "caller", "alice")
    await reach_auth(root, "agent", "w-1")
    wrong = await reach_auth(root, *args)
    assert wrong.returncode != 0
    assert said in wrong.stderr and "Traceback" not in wrong.stderr


def test_patterns_name_an_intent_any_or_a_prefix():
    """``*`` allows any intent, ``prefix*`` those starting so, a name only itself."""
    assert allows(("*",), "anything")
    assert allows(("refund_*",), "refund_status") and not allows(("refund_*",), "refunds")
    assert allows(("summarize",), "summarize") and not allows(("summarize",), "summarize2")
    assert not allows((), "summarize")
    assert parse(" a, b ,a,") == ("a", "b") and parse("") == ()


def test_a_card_is_refused_what_its_allowance_does_not_name():
    """Refusals name each intent and why; no allowance at all refuses every intent."""
    card = AgentCard(agent_id="evil", intents={"summarize": Intent(), "translate": Intent()})
    allowance = Allowance(agent_id="evil", intents=("translate",))
    assert list(refused(card, allowance)) == ["summarize"]
    assert "it may serve: translate" in refused(card, allowance)["summarize"]
    assert set(refused(card, None)) == {"summarize", "translate"}
    other = Allowance(agent_id="someone-else", intents=("*",))
    assert set(refused(card, other)) == {"summarize", "translate"}
