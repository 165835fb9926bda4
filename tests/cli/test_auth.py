"""``reach auth``: a deployment's identities made, shown, revoked and pushed, as an operator
would, against a real secured nats-server; and secrets kept out of log lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
from pathlib import Path

import pytest

from agentreach.agents import Agent, AgentConfigError
from agentreach.auth import AuthDirectory
from agentreach.broker import (
    Auth,
    AuthConfig,
    AuthenticationFailed,
    Broker,
    ConnectError,
    Topology,
    UnusableCredentials,
    provision,
)
from agentreach.cli.logs import redact_secrets
from tests.cli.conftest import VENV_BIN, run, started_until
from tests.secured import SecuredDeployment, secured_server
from tests.support import eventually

REACH = VENV_BIN / "reach"


async def reach_auth(directory: Path, *args: str, **env: str):  # type: ignore[no-untyped-def]
    return await run(REACH, "auth", *args, "--dir", directory, env=env)


async def test_init_and_issue_write_private_files_and_print_only_paths(tmp_path):
    directory = tmp_path / "auth"
    made = await reach_auth(directory, "init")
    assert made.returncode == 0, made.stderr
    assert "include" in made.stdout and "coordinator.creds" in made.stdout
    issued = await reach_auth(directory, "agent", "worker-1")
    assert issued.returncode == 0, issued.stderr
    creds = directory / "creds" / "agent" / "worker-1.creds"
    assert f"--creds {creds}" in issued.stdout
    seed = creds.read_text().split("-----BEGIN USER NKEY SEED-----\n")[1].split("\n")[0]
    assert seed.startswith("SU") and seed not in made.stdout + issued.stdout
    for path in [directory, *directory.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is readable by others ({oct(mode)})"


async def test_a_creds_file_issued_again_over_a_readable_one_is_private(tmp_path):
    """A creds file there already kept its mode when issued again (O_TRUNC keeps it): a
    0644 one stayed readable by everyone with its new seed (security re-test)."""
    directory = tmp_path / "auth"
    await reach_auth(directory, "init")
    await reach_auth(directory, "agent", "worker-1")
    creds = directory / "creds" / "agent" / "worker-1.creds"
    creds.chmod(0o644)
    again = await reach_auth(directory, "agent", "worker-1")
    assert again.returncode == 0, again.stderr
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600


async def test_names_are_unique_across_roles_and_must_be_tokens(tmp_path):
    directory = tmp_path / "auth"
    await reach_auth(directory, "init")
    await reach_auth(directory, "caller", "alice")
    twice = await reach_auth(directory, "agent", "alice")
    assert twice.returncode == 1
    assert twice.stderr.strip() == (
        "reach: error: 'alice' is already issued as caller; names are unique across roles"
    )
    dotted = await reach_auth(directory, "agent", "bad.name")
    assert dotted.returncode == 1 and "becomes a subject token" in dotted.stderr
    reserved = await reach_auth(directory, "agent", "coordinator-2")
    assert reserved.returncode == 1 and "reserved" in reserved.stderr
    again = await reach_auth(directory, "init")
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr
    missing = await reach_auth(tmp_path / "nowhere", "agent", "w1")
    assert missing.returncode == 1 and "reach auth init" in missing.stderr
    assert "REACH_AUTH_DIR" in missing.stderr


async def test_an_incomplete_directory_is_not_told_to_init_again(tmp_path):
    """With operator/ moved away (the seed put offline, say), `reach auth` says what is
    missing instead of suggesting an init that would make every issued creds useless; with
    only the operator's seed gone, issuing still works."""
    directory = tmp_path / "auth"
    await reach_auth(directory, "init")
    (directory / "operator" / "operator.nk").unlink()  # the one seed that may go offline
    issued = await reach_auth(directory, "agent", "w1")
    assert issued.returncode == 0, issued.stderr
    (directory / "operator" / "operator.jwt").rename(tmp_path / "operator.jwt")
    broken = await reach_auth(directory, "agent", "w2")
    assert broken.returncode == 1 and "incomplete auth directory" in broken.stderr
    assert "would make a new operator" in broken.stderr


async def test_show_names_the_party_of_a_user_key_from_the_server_s_log(tmp_path):
    """nats-server logs a violation with the user's public key only: `reach auth show KEY`
    says whose it is, and whether it was issued again since."""
    directory = tmp_path / "auth"
    await reach_auth(directory, "init")
    await reach_auth(directory, "caller", "billing")
    (first,) = AuthDirectory(directory).keys_of("billing")
    await reach_auth(directory, "caller", "billing")
    second = AuthDirectory(directory).keys_of("billing")[-1]
    old = await reach_auth(directory, "show", first)
    new = await reach_auth(directory, "show", second)
    unknown = await reach_auth(directory, "show", "U" + "A" * 55)
    assert old.returncode == 0, old.stderr
    assert old.stdout.startswith(f"{first}: billing's key, issued again since\n")
    assert f"billing (caller; may send: P1,P2; key {second}):" in old.stdout
    assert new.stdout.startswith(f"{second}: billing's current key\n")
    assert unknown.returncode == 1 and f"was issued the key U{'A' * 55}" in unknown.stderr


async def test_show_expands_the_template_and_list_names_every_party(tmp_path):
    directory = tmp_path / "auth"
    await reach_auth(directory, "init")
    await reach_auth(directory, "agent", "worker-7")
    shown = await reach_auth(directory, "show", "worker-7")
    assert shown.returncode == 0, shown.stderr
    permissions = json.loads(shown.stdout.split("\n", 1)[1])
    assert "$KV.reach_heartbeats.worker-7" in permissions["pub"]["allow"]
    assert "reach.event.completed.*.*.*.worker-7" in permissions["pub"]["allow"]
    assert "_INBOX_worker-7.>" in permissions["sub"]["allow"]
    assert not any("{{" in s for s in permissions["pub"]["allow"])
    listed = await reach_auth(directory, "list")
    assert listed.stdout.split() == [
        "operator",
        "admin",
        "priorities:",
        "P0,P1,P2",
        "coordinator",
        "coordinator",
        "agent",
        "worker-7",
        "intents:",
        "nothing",
        "priorities:",
        "P0,P1,P2",
    ]


async def test_a_new_agent_connects_without_a_restart_and_a_revoked_one_is_cut_off(tmp_path):
    deployment = SecuredDeployment(tmp_path / "auth")
    async with secured_server(deployment, tmp_path / "server") as server:
        pid = server._process.pid
        directory = deployment.directory.root
        issued = await reach_auth(directory, "agent", "late-joiner")
        assert issued.returncode == 0, issued.stderr
        creds = Auth(creds=directory / "creds" / "agent" / "late-joiner.creds")
        async with Broker(server.url, auth=creds) as late:
            assert late.connected
            revoked = await reach_auth(directory, "revoke", "late-joiner")
            assert revoked.returncode == 0 and "reach auth push" in revoked.stdout
            pushed = await reach_auth(directory, "push", "--nats-url", server.url)
            assert pushed.returncode == 0, pushed.stderr
            assert "pushed the account" in pushed.stdout
            await eventually(lambda: not late.connected)  # the server closed it at once
            # Gone for good: the connection says so, for a service to stop.
            await asyncio.wait_for(late.lost.wait(), 30)
        with pytest.raises(AuthenticationFailed, match="check --creds"):
            async with Broker(server.url, auth=creds):
                pass
        assert server._process.pid == pid  # never restarted
        listed = await reach_auth(directory, "list")
        assert "late-joiner (revoked)" in listed.stdout


def test_log_lines_never_carry_secrets():
    event = redact_secrets(
        None,
        "info",
        {
            "event": "connecting",
            "url": "nats://alice:hunter2@h1:4222,tls://s3cr3t@h2:4222",
            "password": "hunter2",
            "token": "s3cr3t",
            "error": "refused at nats://bob:pw@h3",
            "agent_id": "worker-1",
        },
    )
    text = json.dumps(event)
    for secret in ("hunter2", "s3cr3t", ":pw@"):
        assert secret not in text
    assert event["url"] == "nats://alice:***@h1:4222,tls://***@h2:4222"
    assert event["agent_id"] == "worker-1"


async def test_the_coordinator_takes_its_server_and_creds_from_its_config(tmp_path):
    """``broker.url`` and ``broker.auth`` in the config; nothing on the command line."""
    deployment = SecuredDeployment(tmp_path / "auth")
    async with secured_server(deployment, tmp_path / "server") as server:
        config = tmp_path / "coordinator.yaml"
        creds = deployment.coordinator.creds
        config.write_text(f"broker:\n  url: {server.url}\n  auth: {{creds: {creds}}}\n")
        env = {**os.environ, "NATS_URL": "", "NATS_CREDS": ""}
        command = ("coordinator", "--config", config, "--log-format", "json")
        process = await started_until(REACH, *command, said=b"coordinator serving on", env=env)
        process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.wait(), 20)


def test_config_credentials_name_a_missing_file():
    missing = r"broker\.auth\.token_file /nowhere/token does not exist"
    with pytest.raises(ConnectError, match=missing):
        AuthConfig(token_file="/nowhere/token").auth()


@contextlib.asynccontextmanager
async def provisioned_with_agent(tmp_path: Path, agent_id: str):  # type: ignore[no-untyped-def]
    """A provisioned secured server, the creds file `reach auth` issued for ``agent_id``, and
    the directory of `reach auth`."""
    deployment = SecuredDeployment(tmp_path / "auth")
    async with secured_server(deployment, tmp_path / "server") as server:
        async with Broker(server.url, auth=deployment.admin) as admin:
            await provision(admin, Topology.default(admin.names))
        directory = deployment.directory.root
        assert (await reach_auth(directory, "agent", agent_id)).returncode == 0
        yield server, directory / "creds" / "agent" / f"{agent_id}.creds", directory


async def test_a_creds_file_that_is_not_there_is_refused_at_once_not_waited_for(nats_url, tmp_path):
    """A waiting connection (an agent's) waits for a server, not for a file to appear."""
    auth = Auth(creds=tmp_path / "summarizer-1.creds")
    with pytest.raises(UnusableCredentials, match=r"summarizer-1\.creds does not exist"):
        async with asyncio.timeout(5), Broker(nats_url, auth=auth, wait=True):
            pass


async def test_an_agent_given_the_creds_of_another_says_so_before_registering(tmp_path):
    async with provisioned_with_agent(tmp_path, "summarizer-1") as (server, creds, _):
        agent = Agent("newsroom-1", startup_delay=0)
        agent.handler("noop")(lambda ctx, payload: payload)
        expected = r"creds are for agent 'summarizer-1', but this agent is 'newsroom-1'"
        with pytest.raises(AgentConfigError, match=expected):
            async with asyncio.timeout(10), agent.running(server.url, auth=Auth(creds=creds)):
                pass


async def test_a_revoked_agent_stops_and_says_why(tmp_path):
    """`reach agent` whose creds are revoked: the server closes its connection for good, and
    the process exits 1 saying so, instead of retrying a closed connection forever."""
    async with provisioned_with_agent(tmp_path, "echo-1") as (server, creds, directory):
        process = await asyncio.create_subprocess_exec(
            str(REACH),
            *("agent", "agentreach.examples.echo:agent", "--nats-url", server.url),
            *("--creds", str(creds), "--log-format", "json"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "NATS_URL": "", "NATS_CREDS": ""},
        )
        assert process.stderr is not None
        try:
            async with asyncio.timeout(30):
                while b"serving" not in (line := await process.stderr.readline()):
                    assert line, "reach agent exited before serving"
            assert (await reach_auth(directory, "revoke", "echo-1")).returncode == 0
            pushed = await reach_auth(directory, "push", "--nats-url", server.url)
            assert pushed.returncode == 0, pushed.stderr
            _, err = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 1
    assert b"closed the connection for good" in err
