"""Credentials an operator gets wrong are named: expired creds say when they expired and
how to get new ones, at connect time and in `reach auth list`."""

from __future__ import annotations

import asyncio
import re
import shutil

import pytest

from agentreach.agents import ReachClient
from agentreach.broker import Auth, AuthenticationFailed, Broker, ConnectError, find_server_binary
from tests.cli.conftest import VENV_BIN, run
from tests.secured import SecuredDeployment, secured_server

REACH = VENV_BIN / "reach"


@pytest.fixture
def deployment(tmp_path):
    return SecuredDeployment(tmp_path / "auth")


async def test_expired_creds_say_when_and_what_to_do(deployment, tmp_path):
    """Creds whose JWT expired are refused with their expiry and the command that renews
    them, not as if they were wrong or revoked."""
    lapsed = deployment.directory.issue("caller", "lapsed", expires_s=-60)
    async with secured_server(deployment, tmp_path / "server") as server:
        with pytest.raises(AuthenticationFailed) as refused:
            async with Broker(server.url, auth=Auth(creds=lapsed)):
                pass
        said = str(refused.value)
        assert f"the creds in {lapsed} expired at " in said, said
        assert " UTC; issue new ones: reach auth caller lapsed" in said, said
        published = await run(
            REACH, "publish", "echo", "{}", "--nats-url", server.url, "--creds", lapsed
        )
        assert published.returncode == 1
        assert "expired at" in published.stderr, published.stderr


async def test_creds_that_did_not_expire_are_not_called_expired(deployment, tmp_path):
    """Refused creds that are not expired (revoked, of another operator) keep the old hint."""
    later = deployment.directory.issue("caller", "later", expires_s=3600)
    other = SecuredDeployment(tmp_path / "other-auth")
    async with secured_server(other, tmp_path / "server") as server:
        with pytest.raises(AuthenticationFailed) as refused:
            async with Broker(server.url, auth=Auth(creds=later)):
                pass
    assert "expired" not in str(refused.value)
    assert "check --creds" in str(refused.value)


async def test_auth_list_shows_when_creds_expire(deployment):
    """`reach auth list` shows each party's expiry, and which ones have expired."""
    deployment.directory.issue("caller", "lapsed", expires_s=-60)
    deployment.directory.issue("caller", "later", expires_s=3600)
    listed = await run(REACH, "auth", "list", "--dir", deployment.directory.root)
    lines = {line.split()[1]: line for line in listed.stdout.splitlines()}
    assert "expired: " in lines["lapsed"] and lines["lapsed"].endswith(" UTC")
    assert "expires: " in lines["later"]
    assert "expire" not in lines["admin"]  # issued without --expires


async def test_the_include_init_prints_is_one_nats_server_accepts(tmp_path):
    """Done as `reach auth init` says, the server config is valid (the absolute include
    path it printed was refused: nats-server joins it to the config's directory)."""
    made = await run(REACH, "auth", "init", "--dir", tmp_path / "new-auth")  # a dir of its own
    [said] = [line for line in made.stdout.splitlines() if "nats-server:" in line]
    copy, include = re.fullmatch(r"\s*nats-server:\s+copy (\S+) .*: (include \S+)", said).groups()
    ops = tmp_path / "ops"
    ops.mkdir()
    shutil.copy(copy, ops)
    (ops / "nats-server.conf").write_text(f'listen: "127.0.0.1:-1"\n{include}\n')
    checked = await run(find_server_binary(), "-c", "ops/nats-server.conf", "-t", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr


async def test_push_with_a_party_s_creds_says_it_needs_the_system_account_s(deployment, tmp_path):
    """`reach auth push --creds admin.creds` names the system creds it needs, not just
    that nobody answers on $SYS.REQ.CLAIMS.UPDATE."""
    root = deployment.directory.root
    admin = deployment.directory.creds("operator", "admin")
    async with secured_server(deployment, tmp_path / "server") as server:
        pushed = await run(
            REACH, "auth", "push", "--dir", root, "--nats-url", server.url, "--creds", admin
        )
    assert pushed.returncode == 1
    assert "reach auth push needs the system account's creds" in pushed.stderr, pushed.stderr
    assert str(deployment.directory.creds("sys", "push")) in pushed.stderr


async def test_issuing_a_name_again_warns_that_the_old_creds_stay_valid(deployment, tmp_path):
    """A second `reach auth caller billing` says the first creds still work; the rotation it
    names (revoke, issue again, push) ends the old creds and keeps the new ones."""
    root = deployment.directory.root
    first = await run(REACH, "auth", "caller", "billing", "--dir", root)
    assert first.returncode == 0 and "warning" not in first.stderr, first.stderr
    old = tmp_path / "old.creds"
    shutil.copy(deployment.directory.creds("caller", "billing"), old)
    again = await run(REACH, "auth", "caller", "billing", "--dir", root)
    assert again.returncode == 0
    assert "billing was issued before; its old creds stay valid until" in again.stderr
    async with secured_server(deployment, tmp_path / "server") as server:
        async with Broker(server.url, auth=Auth(creds=old)) as still:
            assert still.connected  # as the warning says
        assert (await run(REACH, "auth", "revoke", "billing", "--dir", root)).returncode == 0
        rotated = await run(REACH, "auth", "caller", "billing", "--dir", root)
        assert "warning" not in rotated.stderr, rotated.stderr  # the old ones are revoked
        pushed = await run(REACH, "auth", "push", "--dir", root, "--nats-url", server.url)
        assert pushed.returncode == 0, pushed.stderr
        with pytest.raises(AuthenticationFailed):
            async with Broker(server.url, auth=Auth(creds=old)):
                pass
        new = Auth(creds=deployment.directory.creds("caller", "billing"))
        async with Broker(server.url, auth=new) as rotated_in:
            assert rotated_in.connected


async def test_a_client_whose_creds_expire_while_connected_says_so_on_each_call(
    deployment, tmp_path
):
    """The server closes a connection whose creds expire; each call after it raised a bare
    "connection closed" (a secured cluster trial). It says the connection is closed for
    good, and why."""
    creds = deployment.directory.issue("caller", "shorty", expires_s=2)
    async with (
        secured_server(deployment, tmp_path / "server") as server,
        ReachClient(server.url, auth=Auth(creds=creds)) as client,
    ):
        await asyncio.wait_for(client.broker.lost.wait(), timeout=30)
        with pytest.raises(ConnectError) as refused:
            await client.invoke("echo", {}, ack_deadline_ms=1_000)
        with pytest.raises(ConnectError):
            await client.publish("echo", {})
    said = str(refused.value)
    assert "closed for good" in said and "expired" in said.lower(), said
