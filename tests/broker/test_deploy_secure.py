"""The secured nats-server configurations in deploy/nats/secure/ are ones the server accepts,
with the auth.conf `reach auth init` makes; the local one admits only issued parties."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentreach.broker import Auth, AuthenticationFailed, Broker, EmbeddedServer, find_server_binary
from tests.certificates import certificate_authority, server_certificate
from tests.secured import SecuredDeployment

SECURE = Path(__file__).parents[2] / "deploy" / "nats" / "secure"


def _deployed(tmp_path: Path, name: str, deployment: SecuredDeployment) -> Path:
    """``name`` copied beside an auth.conf, its paths moved into ``tmp_path``."""
    folder = tmp_path / "deployed"
    folder.mkdir(exist_ok=True)
    (folder / "auth.conf").write_text(deployment.directory.server_config_text(tmp_path / "jwt"))
    text = (SECURE / name).read_text()
    text = text.replace("/etc/reach/tls", str(tmp_path / "tls"))
    text = text.replace("/var/lib/reach/nats", str(tmp_path / "store"))
    text = text.replace('".reach/secure-nats"', f'"{tmp_path / "store"}"')
    config = folder / name
    config.write_text(text)
    return config


def _certificates(folder: Path) -> None:
    """A CA and the server, route and client certificates the configs name (test only)."""
    server_certificate(folder, certificate_authority(folder, "ca"), "server")
    server_certificate(folder, certificate_authority(folder, "route-ca"), "route")


@pytest.mark.parametrize("name", ["nats-server.conf", "cluster-node.conf", "local.conf"])
async def test_secure_configs_are_valid(tmp_path, name):
    _certificates(tmp_path / "tls")
    config = _deployed(tmp_path, name, SecuredDeployment(tmp_path / "auth"))
    process = await asyncio.create_subprocess_exec(
        str(find_server_binary()),
        "-c",
        str(config),
        "-t",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0, out.decode()
    assert b"is valid" in out


async def test_the_local_secure_config_admits_only_issued_parties(tmp_path):
    deployment = SecuredDeployment(tmp_path / "auth")
    config = _deployed(tmp_path, "local.conf", deployment)
    config.write_text(config.read_text().replace("127.0.0.1:4222", "127.0.0.1:-1"))
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "store", config=config) as server:
        async with Broker(server.url, auth=deployment.auth("agent", "worker-1")) as agent:
            assert agent.connected
        with pytest.raises(AuthenticationFailed):
            async with Broker(server.url, auth=Auth()):
                pass
