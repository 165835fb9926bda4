"""A JetStream cluster of embedded nats-servers on loopback, for development and tests.

    async with EmbeddedCluster(store_dir=Path(".reach/cluster")) as cluster:
        cluster.url                         # the seed list, nats://127.0.0.1:4222,...
        node = await cluster.leader_of("REACH_TASKS")
        await cluster.kill(node)            # kill -9
        await cluster.start(node)           # the same ports and store

Each node gets a config written beside its store (the command line has no server tags and
no ``sync_interval``), in the form of ``deploy/nats/cluster/n1.conf``. Every node lists every
route, so any two make a quorum and a node restarted alone finds the others. The configs are
written only once every store is held: a second cluster refused for a store in use must not
leave the running one's nodes to come back, at their next restart, on its ports.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog

from agentreach.broker.embedded import EmbeddedServer
from agentreach.broker.errors import EmbeddedServerError
from agentreach.broker.ports import free_ports
from agentreach.logs import get_logger

log = get_logger("broker.cluster")

DEFAULT_CLUSTER_DIR = Path(".reach/cluster")
ROUTE_OFFSET = 2000  # client 4222 → route 6222 → monitoring 8222, as in deploy/nats/cluster
HTTP_OFFSET = 4000
DEFAULT_SYNC = "2m"  # the server's own default: fsync every 2 minutes
SYNC_ALWAYS = "always"
ZONES = "abcdefghij"

_CONFIG = """\
# Written by agentreach.broker.cluster.EmbeddedCluster; node {index} of {size}.
server_name: {name}
listen: {host}:{client}
http: {host}:{http}
server_tags: ["az:{zone}", "sync:{sync_tag}"]
ping_interval: "20s"
cluster {{
  name: {cluster}
  listen: {host}:{route}
  routes: [{routes}]
}}
jetstream {{
  store_dir: "{store}"
  max_memory_store: 256MB
  max_file_store: 4GB
  sync_interval: "{sync}"
}}
"""


class EmbeddedCluster:
    """``size`` nats-servers with JetStream forming one cluster, started on enter (ready once
    every node is healthy and a meta leader is elected) and stopped on exit.

    Nodes are numbered from 0 and named ``n1``, ``n2`` …; tagged ``az:a``, ``az:b`` … and
    ``sync:default`` or ``sync:always`` after their ``sync_interval``. ``client_port`` is the
    first node's client port (the next nodes take the next ports), ``route_port`` and
    ``http_port`` the first route and monitoring ports (default: client +2000 and +4000);
    None picks free ports.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        store_dir: Path | str = DEFAULT_CLUSTER_DIR,
        client_port: int | None = None,
        route_port: int | None = None,
        http_port: int | None = None,
        host: str = "127.0.0.1",
        sync_interval: str | Sequence[str] = DEFAULT_SYNC,
        name: str = "reach",
        ready_timeout: float = 60.0,
    ) -> None:
        if size < 1:
            raise EmbeddedServerError(f"a cluster needs at least one node, not {size}")
        syncs = [sync_interval] * size if isinstance(sync_interval, str) else list(sync_interval)
        if len(syncs) != size:
            raise EmbeddedServerError(f"{len(syncs)} sync intervals for {size} nodes")
        self.size = size
        self.host = host
        self.store_dir = Path(store_dir)
        self.name = name
        self.ready_timeout = ready_timeout
        self._syncs = syncs
        self._ports = _ports(size, host, client_port, route_port, http_port)
        self._servers: list[EmbeddedServer | None] = [None] * size
        self._entered = False

    # -- where ----------------------------------------------------------------------
    def node_name(self, node: int) -> str:
        return f"n{node + 1}"

    def node_of(self, server_name: str) -> int:
        """The index of the node called ``server_name`` (``n2`` → 1)."""
        return int(server_name.removeprefix("n")) - 1

    def url_of(self, node: int) -> str:
        return f"nats://{self.host}:{self._ports[node][0]}"

    @property
    def urls(self) -> list[str]:
        return [self.url_of(node) for node in range(self.size)]

    @property
    def url(self) -> str:
        """The seed list every client is given: all nodes, comma-separated."""
        return ",".join(self.urls)

    def monitoring_url(self, node: int) -> str:
        return f"http://{self.host}:{self._ports[node][2]}"

    def running(self, node: int) -> bool:
        server = self._servers[node]
        return server is not None and server.running

    # -- lifecycle ------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self._entered:
            raise EmbeddedServerError("this EmbeddedCluster was already started")
        self._entered = True
        servers = [self._server(node) for node in range(self.size)]
        try:
            for server in servers:  # every store free, or nothing is written
                server.hold_store()
        except EmbeddedServerError:
            await asyncio.gather(*(server.stop() for server in servers))  # their locks
            raise
        self._servers[:] = servers
        try:
            await asyncio.gather(*(self._begin(node) for node in range(self.size)))
            await self.wait_healthy()
        except BaseException:
            await self.stop()
            raise
        log.info("embedded nats cluster ready", urls=self.url, store_dir=str(self.store_dir))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop every node that runs (SIGTERM); safe to call twice."""
        await asyncio.gather(*(self.stop_node(node) for node in range(self.size)))

    async def kill(self, node: int) -> None:
        """kill -9 ``node``: no goodbye to its clients or peers."""
        server = self._servers[node]
        if server is not None:
            await server.kill()
        log.info("nats node killed", node=self.node_name(node))

    async def stop_node(self, node: int) -> None:
        """Stop ``node`` cleanly (SIGTERM)."""
        server, self._servers[node] = self._servers[node], None
        if server is not None:
            await server.stop()

    async def keep_up(self, restart_after_s: float) -> None:
        """Start again, ``restart_after_s`` later, each node that ends although nobody
        stopped it (a ``kill -9`` in a failover trial, a crash), on its ports and store;
        until cancelled (see :meth:`EmbeddedServer.keep_up`)."""
        await asyncio.gather(*(self._keep_up(node, restart_after_s) for node in range(self.size)))

    async def _keep_up(self, node: int, after_s: float) -> None:
        if (server := self._servers[node]) is not None:
            with structlog.contextvars.bound_contextvars(node=self.node_name(node)):
                await server.keep_up(after_s)

    async def start(self, node: int) -> None:
        """Start ``node`` again on its ports and store, and wait until it has caught up."""
        await self._start(node)
        await self.wait_healthy([node])

    async def _start(self, node: int) -> None:
        if self.running(node):
            raise EmbeddedServerError(f"node {self.node_name(node)} is running already")
        self._servers[node] = self._server(node)
        await self._begin(node)

    async def _begin(self, node: int) -> None:
        server = self._servers[node]
        assert server is not None
        try:
            await server.__aenter__()
        except BaseException:
            self._servers[node] = None
            await server.stop()  # the store it may hold
            raise

    def _server(self, node: int) -> EmbeddedServer:
        """The node's server, not started: it writes its config (this cluster's ports) each
        time it starts, restarts included, once it holds its store."""
        store = self.store_dir / self.node_name(node)
        return EmbeddedServer(
            host=self.host,
            store_dir=store,
            ready_timeout=self.ready_timeout,
            config=store / "nats-server.conf",
            config_text=self._config(node, store),
        )

    def _config(self, node: int, store: Path) -> str:
        client, route, http = self._ports[node]
        sync = self._syncs[node]
        routes = ", ".join(f"nats-route://{self.host}:{r}" for _, r, _ in self._ports)
        return _CONFIG.format(
            index=node + 1,
            size=self.size,
            name=self.node_name(node),
            host=self.host,
            client=client,
            route=route,
            http=http,
            zone=ZONES[node % len(ZONES)],
            sync_tag="always" if sync == SYNC_ALWAYS else "default",
            sync=sync,
            cluster=self.name,
            routes=routes,
            store=store.resolve(),
        )

    # -- what the servers say -------------------------------------------------------
    async def wait_healthy(self, nodes: Sequence[int] | None = None) -> None:
        """Until each of ``nodes`` (default: every running one) answers ``/healthz`` (its
        JetStream is up, it knows the meta leader and its streams are current) and the meta
        leader counts every running node as a current peer (before that, placing a
        replicated stream may fail as "peer offline")."""
        nodes = [n for n in (nodes if nodes is not None else range(self.size)) if self.running(n)]
        try:
            async with asyncio.timeout(self.ready_timeout):
                # Polling: no server event says "healthy".
                while not (  # noqa: ASYNC110
                    all(await asyncio.gather(*(self._healthy(n) for n in nodes)))
                    and await self._meta_current()
                ):
                    await asyncio.sleep(0.1)
        except TimeoutError:
            names = ", ".join(self.node_name(n) for n in nodes)
            raise EmbeddedServerError(
                f"nats nodes {names} not healthy within {self.ready_timeout:g} s"
            ) from None

    async def leader_of(self, stream: str, consumer: str | None = None) -> int | None:
        """The node leading ``stream`` (or its ``consumer``) now, as the running nodes report
        it; None while none does (an election)."""
        for node in range(self.size):
            if not self.running(node):
                continue
            found = _leader_in(await self._jsz(node, consumer is not None), stream, consumer)
            if found:
                return self.node_of(found)
        return None

    async def meta_leader(self) -> int | None:
        """The node the running nodes take for the meta leader now; None while they know
        none (an election, or a lost majority)."""
        for node in range(self.size):
            if self.running(node):
                leader = ((await self._jsz_of(node, "")).get("meta_cluster") or {}).get("leader")
                if leader and self.running(self.node_of(leader)):
                    return self.node_of(leader)
        return None

    async def wait_leader(
        self, stream: str, *, consumer: str | None = None, not_on: int | None = None
    ) -> int:
        """Until a running node other than ``not_on`` leads ``stream`` (or its consumer)."""
        async with asyncio.timeout(self.ready_timeout):
            while True:
                node = await self.leader_of(stream, consumer)
                if node is not None and node != not_on and self.running(node):
                    return node
                await asyncio.sleep(0.05)  # polling, as above

    async def _meta_current(self) -> bool:
        """Whether the meta leader runs and sees every other running node as current."""
        running = [n for n in range(self.size) if self.running(n)]
        if len(running) <= 1:
            return True
        meta = (await self._jsz_of(running[0], "")).get("meta_cluster") or {}
        leader = meta.get("leader")
        if not leader or not self.running(self.node_of(leader)):
            return False
        meta = (await self._jsz_of(self.node_of(leader), "")).get("meta_cluster") or {}
        current = {r.get("name") for r in meta.get("replicas") or [] if r.get("current")}
        return all(self.node_name(n) in current for n in running if self.node_name(n) != leader)

    async def _healthy(self, node: int) -> bool:
        url = f"{self.monitoring_url(node)}/healthz"
        return await asyncio.to_thread(_get, url) is not None

    async def _jsz(self, node: int, consumers: bool) -> dict[str, Any]:
        query = "accounts=true&streams=true" + ("&consumers=true" if consumers else "")
        return await self._jsz_of(node, query)

    async def _jsz_of(self, node: int, query: str) -> dict[str, Any]:
        text = await asyncio.to_thread(_get, f"{self.monitoring_url(node)}/jsz?{query}")
        return json.loads(text) if text else {}


def _leader_in(jsz: dict[str, Any], stream: str, consumer: str | None) -> str | None:
    for account in jsz.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") != stream:
                continue
            if consumer is None:
                return (detail.get("cluster") or {}).get("leader")
            for info in detail.get("consumer_detail") or []:
                if info.get("name") == consumer:
                    return (info.get("cluster") or {}).get("leader")
    return None


def _get(url: str) -> str | None:
    """The body of a 200 answer, else None (a node starting, stopped or unhealthy)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.read().decode()
    except (OSError, urllib.error.URLError):
        return None


def _ports(
    size: int, host: str, first: int | None, routes: int | None, http: int | None
) -> list[tuple[int, int, int]]:
    """(client, route, monitoring) per node: from ``first`` (and ``routes``, ``http``), or
    free ones."""
    if first is not None:
        starts = (first, first + ROUTE_OFFSET if routes is None else routes)
        starts += (first + HTTP_OFFSET if http is None else http,)
        _check_ranges(size, starts)
        return [(starts[0] + i, starts[1] + i, starts[2] + i) for i in range(size)]
    if routes is not None or http is not None:
        raise EmbeddedServerError("route and monitoring ports need a first client port too")
    chosen = free_ports(host, size * 3)
    return [tuple(chosen[i * 3 : i * 3 + 3]) for i in range(size)]  # type: ignore[misc]


def _check_ranges(size: int, starts: tuple[int, int, int]) -> None:
    """Each kind of port takes ``size`` ports from its start: in range, and apart."""
    kinds = ("client", "route", "monitoring")
    for kind, start in zip(kinds, starts, strict=True):
        if not 1 <= start <= 65536 - size:
            raise EmbeddedServerError(f"{kind} ports {start}-{start + size - 1}: out of range")
    for i, j in ((0, 1), (0, 2), (1, 2)):
        if abs(starts[i] - starts[j]) < size:
            raise EmbeddedServerError(
                f"{kinds[i]} ports from {starts[i]} and {kinds[j]} ports from {starts[j]}"
                f" overlap ({size} nodes take {size} of each)"
            )
