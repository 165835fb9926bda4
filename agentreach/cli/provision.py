"""``reach provision``: every stream and bucket, idempotent."""

from __future__ import annotations

import argparse
import sys

from agentreach.broker import provision
from agentreach.broker.provisioning import PATIENCE_S
from agentreach.cli.options import (
    Commands,
    broker_config_of,
    broker_of,
    names_of,
    operators_only,
    replication_options,
)
from agentreach.coordinator import load_config


def register(commands: Commands) -> None:
    prov = commands.add(
        "provision",
        cmd_provision,
        "create or update every stream and bucket",
        example="reach provision --config deploy/coordinator/coordinator.yaml",
    )
    prov.add_argument(
        "--config",
        help="coordinator YAML config (its queue capacities, broker, audit, claim_check and"
        " limits sections); without it, what exists keeps its limits, capacities and retention",
    )
    replication_options(prov)


async def cmd_provision(args: argparse.Namespace) -> int:
    # Refused by the server, the stream API's requests would time out: read as a cluster
    # electing a leader, they were waited for without end.
    operators_only(args, "provisioning the streams and buckets")
    names = names_of(args)
    config = load_config(args.config)
    replication = broker_config_of(args, config.broker)
    topology = config.topology(names, replication)
    async with broker_of(args) as broker:
        # A command: it waits out a leader election, not a cluster whose majority is down.
        # Without a config, what exists keeps the limits a coordinator's config set: an
        # operator who runs it to look must not lift them cluster-wide.
        keep = args.config is None
        report = await provision(broker, topology, patience_s=PATIENCE_S, keep=keep)
    setting = replication.replicas
    resolved = f"auto → {report.replicas}" if setting == "auto" else str(setting)
    print(f"replicas: {resolved}; work streams placed on: {_tags(replication.work_tags)}")
    if keep:  # to people, not into the table a script reads
        print(
            "limits: kept as they are (no --config: byte and message limits, queue capacities"
            " and retention are a coordinator config's; --config applies one)",
            file=sys.stderr,
        )
    print(report.table())
    return 0


def _tags(tags: tuple[str, ...]) -> str:
    if tags:
        return ", ".join(tags)
    return "where they were, else any server (no durability profile asked: none is undone)"
