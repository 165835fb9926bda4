"""``reach provision`` (every stream and bucket, idempotent) and ``reach schema``."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from agentreach import envelopes
from agentreach.broker import Topology, provision
from agentreach.cli.options import Commands, broker_of, names_of
from agentreach.coordinator import load_config


def register(commands: Commands) -> None:
    prov = commands.add("provision", cmd_provision, "create or update every stream and bucket")
    prov.add_argument("--config", help="coordinator YAML config (its queue capacities)")
    schema = commands.add("schema", cmd_schema, "print the JSON Schema of envelope v1")
    schema.add_argument("--out", help="write to this file instead")


async def cmd_provision(args: argparse.Namespace) -> int:
    names = names_of(args)
    capacities = load_config(args.config).queues.capacities
    topology = Topology.default(names, queue_capacity=capacities)
    async with broker_of(args) as broker:
        outcomes = await provision(broker, topology)
    for name, outcome in outcomes.items():
        print(f"{name:<24} {outcome}")
    return 0


async def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(envelopes.json_schema(), indent=2)
    if args.out:
        await asyncio.to_thread(Path(args.out).write_text, text + "\n")
    else:
        print(text)
    return 0
