"""How Agent-Reach's streams and buckets are replicated and placed: the ``broker`` section of
the config, and what ``replicas: auto`` means on the server at hand.

    broker:
      replicas: auto        # auto | 1 | 3 | 5; auto = 3 on a JetStream cluster of >= 3 peers
      durable: false        # true: tasks, dispatch and DLQ on servers tagged sync:always
      durable_tags: [sync:always]

A normal account cannot ask how many JetStream peers a cluster has (that takes the system
account), so ``auto`` asks the server to create a throwaway R3 stream: created means three
peers or more; refused as "not clustered" (10074), or as "no suitable peers" (10005) for a few
seconds running, means one. Once the task stream has three replicas or more, ``auto`` means
what it has: with a node down the probe finds too few peers, but the cluster is still one.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal

import msgspec
import nats.errors
import nats.js.errors
from nats.js import api
from nats.nuid import NUID

from agentreach.broker.auth import AuthConfig
from agentreach.broker.errors import ProvisionError, translate
from agentreach.logs import get_logger

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

log = get_logger("broker.replication")

Replicas = Literal["auto", 1, 3, 5]
AUTO: Replicas = "auto"
CHOICES: tuple[Replicas, ...] = ("auto", 1, 3, 5)
DURABLE_TAG = "sync:always"
NOT_CLUSTERED = 10074  # "replicas > 1 not supported in non-clustered mode"
NO_SUITABLE_PEERS = 10005  # "insufficient resources" / "no suitable peers for placement"
CLUSTERED_REPLICAS = 3
PEERS_PATIENCE_S = 5.0  # a peer that has just started is "offline" for a moment
PATIENCE_S = 30.0  # a cluster that has just started has no meta leader for a moment


class BrokerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How streams and buckets are replicated and where the ones carrying work are placed.

    ``replicas``: ``auto`` (3 on a JetStream cluster of three peers or more, else 1) or a
    number. Raising it scales existing streams up in place; ``auto`` never scales down (a
    cluster that lost a node must not shrink its streams), an explicit number may.
    ``durable``: place ``REACH_TASKS``, the dispatch streams and ``REACH_DLQ`` on servers
    tagged with every one of ``durable_tags`` (servers that run ``sync_interval: always``).
    """

    replicas: Replicas = AUTO
    durable: bool = False
    durable_tags: tuple[str, ...] = (DURABLE_TAG,)
    url: str | None = None  # the seed list; --nats-url and NATS_URL come first
    auth: AuthConfig = AuthConfig()  # --creds etc. and NATS_CREDS etc. come first

    @property
    def work_tags(self) -> tuple[str, ...]:
        """The placement tags of the streams that carry work (none unless ``durable``)."""
        return self.durable_tags if self.durable else ()


def parse_replicas(text: str) -> Replicas:
    """``--replicas`` on the command line: ``auto``, 1, 3 or 5; raises ValueError."""
    value: str | int = text.strip().lower()
    if value != AUTO:
        try:
            value = int(value)
        except ValueError:
            value = -1
    if value not in CHOICES:
        raise ValueError(f"replicas must be auto, 1, 3 or 5, not {text!r}")
    return value  # type: ignore[return-value]


async def resolve_replicas(broker: Broker, setting: Replicas) -> int:
    """The number of replicas ``setting`` means on this server.

    A cluster that has just started may not count its peers yet ("no suitable peers") or not
    answer at all (no meta leader): the probe is made again for a few seconds before it
    concludes one replica, or up to half a minute before it gives up.
    """
    if setting != AUTO:
        return int(setting)
    if (kept := await _replicas_in_place(broker)) >= CLUSTERED_REPLICAS:
        return kept  # chosen when the cluster was whole: a node down must not make it 1
    loop = asyncio.get_running_loop()
    started = loop.time()
    unanswered = False
    while True:
        try:
            return await _probe(broker)
        except _TooFewPeers:
            if loop.time() - started > PEERS_PATIENCE_S:
                log.debug("replicas auto: 1 (fewer than 3 JetStream peers)")
                return 1
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            if loop.time() - started > PATIENCE_S:
                raise translate(exc, subject="$JS.API.STREAM.CREATE") from exc
            if not unanswered:
                unanswered = True
                log.info(
                    "replicas auto: JetStream does not answer the probe yet; trying again",
                    for_s=PATIENCE_S,
                    error=str(exc) or type(exc).__name__,
                )
        except nats.errors.Error as exc:
            raise translate(exc, subject="$JS.API.STREAM.CREATE") from exc
        await asyncio.sleep(1.0)


async def _replicas_in_place(broker: Broker) -> int:
    """The replicas of the task stream, if it exists (0 if not)."""
    try:
        info = await broker.js.stream_info(broker.names.tasks_stream)
    except nats.js.errors.NotFoundError:
        return 0
    return info.config.num_replicas or 1


class _TooFewPeers(Exception):
    pass


async def _probe(broker: Broker) -> int:
    """Place a throwaway R3 stream: 3 when the server can, 1 when it is not clustered."""
    name = f"{broker.names.prefix.upper()}_REPLICA_PROBE_{NUID().next().decode()}"
    probe = api.StreamConfig(
        name=name,
        subjects=[f"_{broker.names.prefix}.replica_probe.{name}"],
        num_replicas=CLUSTERED_REPLICAS,
        storage=api.StorageType.MEMORY,
        max_msgs=1,
        max_bytes=1024,
    )
    try:
        await broker.js.add_stream(probe)
    except nats.js.errors.APIError as exc:
        if exc.err_code == NOT_CLUSTERED:
            log.debug("replicas auto: 1", why=exc.description)
            return 1
        if exc.err_code == NO_SUITABLE_PEERS:
            raise _TooFewPeers from exc
        raise ProvisionError(f"cannot tell the cluster's size: {exc.description}") from exc
    try:
        await broker.js.delete_stream(name)
    except nats.errors.Error as exc:  # it holds nothing; say so, and go on
        log.warning("replica probe stream not deleted", stream=name, error=str(exc))
    log.debug("replicas auto: 3")
    return CLUSTERED_REPLICAS
