"""``reach provision``: every stream and bucket, idempotent."""

from __future__ import annotations

import argparse

from agentreach.broker import Topology, provision
from agentreach.cli.options import Commands, broker_of, names_of
from agentreach.coordinator import load_config


def register(commands: Commands) -> None:
    prov = commands.add("provision", cmd_provision, "create or update every stream and bucket")
    prov.add_argument("--config", help="coordinator YAML config (its queue capacities)")


async def cmd_provision(args: argparse.Namespace) -> int:
    names = names_of(args)
    capacities = load_config(args.config).queues.capacities
    topology = Topology.default(names, queue_capacity=capacities)
    async with broker_of(args) as broker:
        outcomes = await provision(broker, topology)
    for name, outcome in outcomes.items():
        print(f"{name:<24} {outcome}")
    return 0
