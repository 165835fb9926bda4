"""The NATS / JetStream layer, the only part of Agent-Reach that talks to nats-py.

Connection (:class:`Broker`, to one server or a cluster's seed list), names, topology,
replication and provisioning, typed KV buckets with compare-and-set, consumers and the
messages they deliver, reading streams, lifecycle publishing (events, replies, dead letters),
presence probes, the embedded nats-server and an embedded cluster of them.
Every nats-py exception is translated into a :class:`BrokerError` here.
"""

from agentreach.broker.auth import Auth, AuthConfig
from agentreach.broker.bucket import Bucket, Entry, Swap
from agentreach.broker.claim_check import ClaimCheck, PayloadUnavailable
from agentreach.broker.cluster import EmbeddedCluster
from agentreach.broker.connection import Broker
from agentreach.broker.consume import (
    ConsumerSpec,
    ConsumerState,
    PullConsumer,
    bind,
    consumer_state,
    follow,
    set_ack_wait,
)
from agentreach.broker.direct import read_stream
from agentreach.broker.embedded import EmbeddedServer, find_server_binary
from agentreach.broker.errors import (
    AuthenticationFailed,
    BrokerError,
    BrokerTimeout,
    ConnectError,
    ConnectionBroke,
    ConsumerNotFound,
    Contended,
    EmbeddedServerError,
    JetStreamError,
    NoResponders,
    NoStreamError,
    ProvisionError,
    StreamFull,
    StreamNotFound,
    SubjectFull,
    TlsFailed,
    TooLarge,
    Unavailable,
    UnusableCredentials,
    ValueTooLarge,
    WrongLastSequence,
)
from agentreach.broker.immediate import listen
from agentreach.broker.messages import Delivery, Inbound, Subscription
from agentreach.broker.names import Names
from agentreach.broker.pipelined import Outgoing
from agentreach.broker.provisioned import Provisioned, Provisioning
from agentreach.broker.provisioning import Provisioner, provision, wait_provisioned
from agentreach.broker.replication import BrokerConfig, Replicas, parse_replicas, resolve_replicas
from agentreach.broker.streams import StoredMessage
from agentreach.broker.topology import BucketSpec, Outcome, StreamSpec, Topology
from agentreach.broker.urls import DEFAULT_URL, redacted, resolve_url, server_list
from agentreach.broker.watch import BucketWatch, Change

__all__ = [
    "DEFAULT_URL",
    "Auth",
    "AuthConfig",
    "AuthenticationFailed",
    "Broker",
    "BrokerConfig",
    "BrokerError",
    "BrokerTimeout",
    "Bucket",
    "BucketSpec",
    "BucketWatch",
    "Change",
    "ClaimCheck",
    "ConnectError",
    "ConnectionBroke",
    "ConsumerNotFound",
    "ConsumerSpec",
    "ConsumerState",
    "Contended",
    "Delivery",
    "EmbeddedCluster",
    "EmbeddedServer",
    "EmbeddedServerError",
    "Entry",
    "Inbound",
    "JetStreamError",
    "Names",
    "NoResponders",
    "NoStreamError",
    "Outcome",
    "Outgoing",
    "PayloadUnavailable",
    "ProvisionError",
    "Provisioned",
    "Provisioner",
    "Provisioning",
    "PullConsumer",
    "Replicas",
    "StoredMessage",
    "StreamFull",
    "StreamNotFound",
    "StreamSpec",
    "SubjectFull",
    "Subscription",
    "Swap",
    "TlsFailed",
    "TooLarge",
    "Topology",
    "Unavailable",
    "UnusableCredentials",
    "ValueTooLarge",
    "WrongLastSequence",
    "bind",
    "consumer_state",
    "find_server_binary",
    "follow",
    "listen",
    "parse_replicas",
    "provision",
    "read_stream",
    "redacted",
    "resolve_replicas",
    "resolve_url",
    "server_list",
    "set_ack_wait",
    "wait_provisioned",
]
