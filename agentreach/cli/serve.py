"""Long-running commands: ``reach up``, ``reach coordinator``, ``reach agent``, ``reach demo``;
the optional embedded server, provisioning, signals and a clean shutdown."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import msgspec
import prometheus_client
import structlog
from prometheus_client import CollectorRegistry

from agentreach.agents import Agent
from agentreach.broker import (
    DEFAULT_URL,
    AuthenticationFailed,
    Broker,
    EmbeddedCluster,
    EmbeddedServer,
    Names,
    Topology,
    provision,
)
from agentreach.broker.tasks import cancel_and_wait
from agentreach.broker.urls import redacted
from agentreach.cli.coordinating import coordinator_options, with_cli_options
from agentreach.cli.logs import say
from agentreach.cli.options import (
    ASKING_ROLES,
    Commands,
    UsageError,
    auth_of,
    broker_config_of,
    embedded_server_options,
    load_target,
    names_of,
    non_negative_seconds,
    replication_options,
)
from agentreach.coordinator import Coordinator, CoordinatorConfig, load_config
from agentreach.coordinator.observability import serving
from agentreach.coordinator.observability.endpoint import Readiness
from agentreach.envelopes import Priority

log = structlog.get_logger("reach")

DEMO_STORE = Path(".reach/demo/nats")
CLUSTER_STORE = Path(".reach/cluster")
RESTART_AFTER_S = 10.0  # past a leader election (3.5-8.6 s): the failover is seen first
DEVELOPMENT = "development server: no authentication, loopback only (README: Securing a deployment)"
NATS_STORE = Path(".reach/nats")  # the default --data-dir of `reach up`
TWO_NODES = (
    "a cluster of 2 nodes tolerates no node failure: replicas auto gives every stream 1"
    " replica, and a node that stops takes its streams with it; 3 nodes is the smallest"
    " cluster that rides out the loss of one"
)
UP_PORT = 4222  # the default --port of `reach up`


def register(commands: Commands) -> None:
    up = commands.add(
        "up",
        cmd_up,
        "run the coordinator, with an embedded nats-server unless a URL",
        example="reach up --config deploy/coordinator/coordinator.yaml",
        serves=True,
    )
    embedded_server_options(up, UP_PORT, store=NATS_STORE)
    up.add_argument(
        "--cluster",
        type=int,
        metavar="N",
        default=None,
        help="start N embedded nats-servers as one JetStream cluster on loopback (client ports"
        " from --port, routes +2000, monitoring +4000 unless --cluster-ports; stores under"
        " ./.reach/cluster, or --data-dir, in n1, n2 …)",
    )
    up.add_argument(
        "--cluster-ports",
        type=_port_pair,
        metavar="ROUTE,MONITORING",
        default=None,
        help="with --cluster and --port: the first route and monitoring ports (each node takes"
        " the next), as 6222,8222",
    )
    up.add_argument(
        "--restart-after",
        type=float,
        metavar="S",
        default=RESTART_AFTER_S,
        help="an embedded nats-server (or --cluster node) that ends (kill -9, a crash) is"
        f" started again S seconds later, on its ports and store (default {RESTART_AFTER_S:g};"
        " 0: never)",
    )
    coordinator = commands.add(
        "coordinator",
        cmd_coordinator,
        "run a coordinator replica",
        example="reach coordinator --nats-url nats://10.0.0.5:4222 --metrics-port 9465",
        serves=True,
    )
    for parser in (up, coordinator):
        coordinator_options(parser)
        replication_options(parser)
    agent = commands.add(
        "agent",
        cmd_agent,
        "serve an Agent object: MODULE:OBJECT",
        example="reach agent agentreach.examples.summarize:agent",
        serves=True,
    )
    agent.add_argument(
        "target", metavar="MODULE:OBJECT", help="the module and the Agent in it (cwd importable)"
    )
    agent.add_argument(
        "--startup-delay",
        type=non_negative_seconds,
        default=None,
        help="upper bound of the random delay before registering (s)",
    )
    demo = commands.add(
        "demo",
        cmd_demo,
        "embedded server + coordinator + example agents + tasks",
        example="reach demo",
    )
    embedded_server_options(demo, -1, store=DEMO_STORE)


async def cmd_up(args: argparse.Namespace) -> int:
    """Embedded nats-server or cluster (unless --nats-url / $NATS_URL), provision, coordinator."""
    # A mistake in the config or a --workflows module is told before any server starts.
    config = coordinator_config(args)
    if args.cluster is not None:
        if args.nats_url:
            raise UsageError("--cluster starts its own servers: leave out --nats-url / $NATS_URL")
        if args.cluster < 1:
            raise UsageError(f"--cluster needs a number of servers, 1 or more, not {args.cluster}")
        if args.cluster == 2:
            log.warning(TWO_NODES)
        # The stores go under ./.reach/cluster unless --data-dir says where.
        store = CLUSTER_STORE if args.data_dir == NATS_STORE else args.data_dir
        port = None if args.port == -1 else args.port
        routes, http = args.cluster_ports or (None, None)
        if args.cluster_ports and port is None:
            raise UsageError("--cluster-ports needs a --port to start the client ports from")
        cluster = EmbeddedCluster(
            args.cluster, client_port=port, route_port=routes, http_port=http, store_dir=store
        )
        async with cluster:
            log.warning(DEVELOPMENT, urls=cluster.url)
            print(f"reach: agents and tools: export NATS_URL={cluster.url}", file=sys.stderr)
            async with _kept_up(cluster, args.restart_after):
                await _coordinate(cluster.url, args, config)
        return 0
    if args.cluster_ports:
        raise UsageError("--cluster-ports is for the nodes of --cluster")
    _no_embedded_options_for_a_url(args)
    embedded = nats_server(
        args.nats_url, port=args.port, data_dir=args.data_dir, restart_after_s=args.restart_after
    )
    async with embedded as url:
        await _coordinate(url, args, config)
    return 0


def _port_pair(value: str) -> tuple[int, int]:
    """``6222,8222`` → (6222, 8222)."""
    route, sep, http = value.partition(",")
    if not (sep and route.strip().isdigit() and http.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"{value!r}: two port numbers, as 6222,8222")
    return int(route), int(http)


def _no_embedded_options_for_a_url(args: argparse.Namespace) -> None:
    """``--port`` / ``--data-dir`` with a server of the user's own would be ignored."""
    if not args.nats_url:
        return
    given = [
        flag
        for flag, value, default in (
            ("--port", args.port, UP_PORT),
            ("--data-dir", args.data_dir, NATS_STORE),
        )
        if value != default
    ]
    if given:
        source = "$NATS_URL" if args.nats_url == os.environ.get("NATS_URL") else "--nats-url"
        raise UsageError(
            f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} up the embedded"
            f" nats-server, but {source}"
            f" ({redacted(args.nats_url)}) names a server of yours, so none is started:"
            f" leave out one or the other (unset NATS_URL to embed one)"
        )


async def cmd_coordinator(args: argparse.Namespace) -> int:
    config = coordinator_config(args)
    await _coordinate(args.nats_url or config.broker.url or DEFAULT_URL, args, config)
    return 0


def coordinator_config(args: argparse.Namespace) -> CoordinatorConfig:
    """The config file's, with what the command line adds and overrides."""
    config = with_cli_options(load_config(args.config), args)
    return msgspec.structs.replace(config, broker=broker_config_of(args, config.broker))


async def _coordinate(url: str, args: argparse.Namespace, config: CoordinatorConfig) -> None:
    """Serve until a signal; the coordinator waits for NATS and provisions at start."""
    # The _created series of counters are used by no rule: in our own process, leave them out
    # (a library must not change this for the program that embeds it).
    prometheus_client.disable_created_metrics()
    names = Names(prefix=args.prefix or config.prefix)
    auth = auth_of(args).merged(config.broker.auth.auth())
    if auth.role in ASKING_ROLES:  # its subscriptions would be refused, one by one
        raise UsageError(
            f"the coordinator needs a coordinator's creds; {auth.identity!r} is"
            f" {'an' if auth.role == 'agent' else 'a'} {auth.role} (`reach auth init` made"
            " <auth dir>/creds/coordinator/coordinator.creds)"
        )
    broker = Broker(url, names=names, name="coordinator", wait=True, auth=auth)
    async with contextlib.AsyncExitStack() as stack:
        # Probes are answered while NATS is waited for (/healthz 200, /readyz 503 "not
        # connected to NATS"): an orchestrator must not take the wait for a dead process.
        async with serving(config.metrics, CollectorRegistry(), Readiness(broker)):
            await stack.enter_async_context(broker)
        running = Coordinator(broker, config, config_path=args.config).running()
        coordinator = await stack.enter_async_context(running)
        shown = f"; metrics on {coordinator.metrics_url}metrics" if coordinator.metrics_url else ""
        await until_signal(f"coordinator serving on {broker.shown_url}{shown}", broker)
    log.info("coordinator stopped")  # after its last writes (a trial: "stopping", then nothing)


async def cmd_agent(args: argparse.Namespace) -> int:
    agent = load_agent(args.target)
    if args.startup_delay is not None:
        agent.startup_delay = args.startup_delay
    url = args.nats_url or DEFAULT_URL
    async with agent.running(url, names=names_of(args), auth=auth_of(args)) as runtime:
        await until_signal(
            f"agent {agent.agent_id} serving {sorted(agent.handlers)}",
            runtime.broker,
            ended=runtime.replaced,
        )
    if runtime.replaced.is_set():
        raise runtime.replaced_error()
    return 0


async def cmd_demo(args: argparse.Namespace) -> int:
    from agentreach.cli.demo import run_demo

    # Its own store: the demo must never share (or spoil) the one `reach up` serves from.
    async with nats_server(args.nats_url, port=args.port, data_dir=args.data_dir) as url:
        return await run_demo(url, names_of(args))


def load_agent(target: str) -> Agent:
    """The :class:`Agent` named ``MODULE:OBJECT`` (the current directory is importable)."""
    agent = load_target(
        target, malformed="expected MODULE:OBJECT (e.g. agentreach.examples.echo:agent)"
    )
    if agent is None:
        module, _, name = target.partition(":")
        raise UsageError(f"module {module!r} has no {name!r} (expected an agentreach.Agent)")
    if not isinstance(agent, Agent):
        raise UsageError(f"{target} is {type(agent).__name__}, not an agentreach.Agent")
    return agent


@contextlib.asynccontextmanager
async def nats_server(
    url: str | None, *, port: int, data_dir: Path, restart_after_s: float = 0.0
) -> AsyncIterator[str]:
    """``url`` when one was given; otherwise an embedded nats-server for the block, started
    again ``restart_after_s`` after it ends of itself (when > 0)."""
    if url:
        yield url
        return
    async with EmbeddedServer(port=port, store_dir=data_dir) as server:
        log.warning(DEVELOPMENT, url=server.url)
        async with _kept_up(server, restart_after_s):
            yield server.url


@contextlib.asynccontextmanager
async def _kept_up(
    servers: EmbeddedServer | EmbeddedCluster, restart_after_s: float
) -> AsyncIterator[None]:
    """The block, with a server that ends started again ``restart_after_s`` later; with 0,
    said to have ended and left down."""
    keeping = asyncio.create_task(servers.keep_up(restart_after_s), name="reach-keep-nats-up")
    try:
        yield
    finally:
        await cancel_and_wait(keeping)


@contextlib.asynccontextmanager
async def provisioned(
    url: str, names: Names, *, name: str, queue_capacity: Mapping[Priority, int] | None = None
) -> AsyncIterator[Broker]:
    """A connection whose streams and buckets exist (provisioning is idempotent)."""
    async with Broker(url, names=names, name=name) as broker:
        await provision(broker, Topology.default(names, queue_capacity=queue_capacity))
        yield broker


async def until_signal(
    announce: str, broker: Broker | None = None, *, ended: asyncio.Event | None = None
) -> None:
    """Print ``announce`` once Ctrl-C is caught, then return on SIGINT or SIGTERM, or once
    ``ended`` is set; raise AuthenticationFailed when ``broker``'s connection is lost for
    good (its credentials revoked or expired)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        say(f"{announce} (Ctrl-C to stop)")
        waits = [asyncio.create_task(stop.wait())]
        if broker is not None:
            waits.append(asyncio.create_task(broker.lost.wait()))
        if ended is not None:
            waits.append(asyncio.create_task(ended.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(*waits)
        if broker is not None and broker.lost.is_set() and not stop.is_set():
            raise AuthenticationFailed(
                f"{broker.lost_why} ({broker.shown_url}): stopping; when the credentials were"
                " revoked or expired, issue new ones with `reach auth`"
            )
        log.info("stopping")
    finally:
        # A second signal during the shutdown (a process group killed, Ctrl-C twice) must not
        # cut it short: the card would stay `running` for a process that is gone.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _stopping_already)


def _stopping_already() -> None:
    print(
        "reach: stopping already (running tasks get up to 10 s); SIGKILL ends it at once",
        file=sys.stderr,
        flush=True,
    )
