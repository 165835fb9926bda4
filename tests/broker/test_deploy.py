"""The shipped deployment files: nats-server accepts every config (with its environment set),
and the compose file and Kubernetes manifests are what the README says they are."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

from agentreach.broker import find_server_binary

DEPLOY = Path(__file__).parents[2] / "deploy"
NATS = DEPLOY / "nats"
COMPOSE_NODE_ENV = {
    "NATS_SERVER_NAME": "n1",
    "NATS_AZ_TAG": "az:a",
    "NATS_SYNC_INTERVAL": "always",
    "NATS_SYNC_TAG": "sync:always",
}


async def check_config(path: Path, env: dict[str, str] | None = None) -> str:
    """`nats-server -c PATH -t`: its output, after asserting the file is valid."""
    process = await asyncio.create_subprocess_exec(
        str(find_server_binary()),
        "-c",
        str(path),
        "-t",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    out, _ = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 0, out.decode()
    assert b"is valid" in out
    return out.decode()


def env_file(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


async def test_single_node_config_is_valid():
    """`nats-server -c deploy/nats/nats-server.conf -t` passes."""
    await check_config(NATS / "nats-server.conf")


@pytest.mark.parametrize("node", ["n1", "n2", "n3"])
async def test_loopback_cluster_configs_are_valid(node):
    """Each node of the loopback cluster (deploy/nats/cluster) is a valid config."""
    await check_config(NATS / "cluster" / f"{node}.conf")


async def test_real_hosts_config_is_valid_with_its_example_environment():
    """deploy/nats/hosts/node.conf with node.env.example's variables is a valid config."""
    await check_config(NATS / "hosts" / "node.conf", env_file(NATS / "hosts" / "node.env.example"))


async def test_compose_node_config_is_valid_with_the_compose_environment():
    """deploy/nats/compose.conf with the variables the compose file sets is a valid config."""
    await check_config(NATS / "compose.conf", COMPOSE_NODE_ENV)


def test_compose_runs_three_nodes_two_coordinators_and_an_agent_on_the_seed_list():
    """docker-compose.yml: n1-n3 on compose.conf, a one-shot provision before two coordinator
    replicas, the echo agent, and every Agent-Reach process given all three servers."""
    compose = yaml.safe_load((DEPLOY / "docker" / "docker-compose.yml").read_text())
    services = compose["services"]
    nodes = [name for name in ("n1", "n2", "n3") if name in services]
    assert len(nodes) == 3
    for name in nodes:
        assert services[name]["environment"]["NATS_SERVER_NAME"] == name
        assert "../nats/compose.conf:/etc/nats/node.conf:ro" in services[name]["volumes"]
    assert services["coordinator"]["deploy"]["replicas"] == 2
    assert services["coordinator"]["depends_on"]["provision"] == {
        "condition": "service_completed_successfully"
    }
    seeds = "nats://n1:4222,nats://n2:4222,nats://n3:4222"
    for name in ("provision", "coordinator", "echo-agent"):
        assert seeds in services[name]["command"], name
    assert "agentreach.examples.echo:agent" in services["echo-agent"]["command"]


def test_kubernetes_coordinator_has_two_replicas_with_health_probes():
    """The coordinator Deployment runs 2 replicas, never fewer than one ready during a rollout,
    with liveness on /healthz and readiness on /readyz of its metrics port."""
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "coordinator.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--metrics-port" in container["args"]
    config = next(d for d in documents if d["kind"] == "ConfigMap")
    assert len(config["data"]["NATS_URL"].split(",")) == 3
    values = yaml.safe_load((DEPLOY / "kubernetes" / "nats-values.yaml").read_text())
    assert values["config"]["cluster"]["replicas"] == 3
    assert values["config"]["jetstream"]["merge"]["sync_interval"] == "always"
