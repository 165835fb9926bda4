"""Long-running commands: ``reach up``, ``reach coordinator``, ``reach agent``, ``reach demo``;
the optional embedded server, provisioning, signals and a clean shutdown."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import structlog

from agentreach.agents import Agent
from agentreach.broker import DEFAULT_URL, Broker, EmbeddedServer, Names, Topology, provision
from agentreach.cli.options import (
    Commands,
    UsageError,
    auth_of,
    embedded_server_options,
    names_of,
)
from agentreach.coordinator import Coordinator, load_config
from agentreach.envelopes import Priority

log = structlog.get_logger("reach")

DEMO_STORE = Path(".reach/demo/nats")


def register(commands: Commands) -> None:
    up = commands.add(
        "up", cmd_up, "run the coordinator, with an embedded nats-server unless a URL"
    )
    embedded_server_options(up, 4222)
    up.add_argument("--config", help="coordinator YAML config")
    coordinator = commands.add("coordinator", cmd_coordinator, "run a coordinator replica")
    coordinator.add_argument("--config", help="coordinator YAML config")
    agent = commands.add("agent", cmd_agent, "serve an Agent object: MODULE:OBJECT")
    agent.add_argument("target", metavar="MODULE:OBJECT")
    agent.add_argument(
        "--startup-delay",
        type=float,
        default=None,
        help="upper bound of the random delay before registering (s)",
    )
    demo = commands.add("demo", cmd_demo, "embedded server + coordinator + example agents + tasks")
    embedded_server_options(demo, -1, store=DEMO_STORE)


async def cmd_up(args: argparse.Namespace) -> int:
    """Embedded nats-server (unless --nats-url / $NATS_URL), provision, coordinator."""
    async with nats_server(args.nats_url, port=args.port, data_dir=args.data_dir) as url:
        await _coordinate(url, args)
    return 0


async def cmd_coordinator(args: argparse.Namespace) -> int:
    await _coordinate(args.nats_url or DEFAULT_URL, args)
    return 0


async def _coordinate(url: str, args: argparse.Namespace) -> None:
    """Serve until a signal; the coordinator waits for NATS and provisions at start."""
    config = load_config(args.config)
    names = Names(prefix=args.prefix or config.prefix)
    async with (
        Broker(url, names=names, name="coordinator", wait=True, auth=auth_of(args)) as broker,
        Coordinator(broker, config, config_path=args.config).running(),
    ):
        await until_signal(f"coordinator serving on {broker.shown_url}")


async def cmd_agent(args: argparse.Namespace) -> int:
    agent = load_agent(args.target)
    if args.startup_delay is not None:
        agent.startup_delay = args.startup_delay
    url = args.nats_url or DEFAULT_URL
    async with agent.running(url, names=names_of(args), auth=auth_of(args)):
        await until_signal(f"agent {agent.agent_id} serving {sorted(agent.handlers)}")
    return 0


async def cmd_demo(args: argparse.Namespace) -> int:
    from agentreach.cli.demo import run_demo

    # Its own store: the demo must never share (or spoil) the one `reach up` serves from.
    async with nats_server(args.nats_url, port=args.port, data_dir=args.data_dir) as url:
        return await run_demo(url, names_of(args))


def load_agent(target: str) -> Agent:
    """The :class:`Agent` named ``MODULE:OBJECT`` (the current directory is importable)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UsageError(
            f"expected MODULE:OBJECT (e.g. agentreach.examples.echo:agent), got {target!r}"
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    agent = getattr(module, attr, None)
    if not isinstance(agent, Agent):
        raise UsageError(f"{target} is {type(agent).__name__}, not an agentreach.Agent")
    return agent


@contextlib.asynccontextmanager
async def nats_server(url: str | None, *, port: int, data_dir: Path) -> AsyncIterator[str]:
    """``url`` when one was given; otherwise an embedded nats-server for the block."""
    if url:
        yield url
        return
    async with EmbeddedServer(port=port, store_dir=data_dir) as server:
        log.warning(
            "development server: no authentication, loopback only (README: Securing a deployment)",
            url=server.url,
        )
        yield server.url


@contextlib.asynccontextmanager
async def provisioned(
    url: str, names: Names, *, name: str, queue_capacity: Mapping[Priority, int] | None = None
) -> AsyncIterator[Broker]:
    """A connection whose streams and buckets exist (provisioning is idempotent)."""
    async with Broker(url, names=names, name=name) as broker:
        await provision(broker, Topology.default(names, queue_capacity=queue_capacity))
        yield broker


async def until_signal(announce: str) -> None:
    """Print ``announce`` once Ctrl-C is caught, then return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        print(f"reach: {announce} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        await stop.wait()
        log.info("stopping")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
