"""The NATS / JetStream layer, the only part of Agent-Reach that talks to nats-py.

Connection (:class:`Broker`), names, topology and provisioning, typed KV buckets with
compare-and-set, consumers and the messages they deliver, reading streams, lifecycle
publishing (events, replies, dead letters), presence probes, the embedded nats-server.
Every nats-py exception is translated into a :class:`BrokerError` here.
"""

from agentreach.broker.auth import Auth
from agentreach.broker.bucket import Bucket, Contended, Entry, Swap
from agentreach.broker.connection import Broker
from agentreach.broker.consume import (
    ConsumerSpec,
    ConsumerState,
    PullConsumer,
    bind,
    consumer_state,
    follow,
)
from agentreach.broker.direct import read_stream
from agentreach.broker.embedded import EmbeddedServer, find_server_binary
from agentreach.broker.errors import (
    AuthenticationFailed,
    BrokerError,
    BrokerTimeout,
    ConnectError,
    ConsumerNotFound,
    EmbeddedServerError,
    JetStreamError,
    NoResponders,
    NoStreamError,
    ProvisionError,
    StreamNotFound,
    SubjectFull,
    TooLarge,
    Unavailable,
    WrongLastSequence,
)
from agentreach.broker.messages import Delivery, Inbound, Subscription
from agentreach.broker.names import Names
from agentreach.broker.provisioning import Provisioner, provision, wait_provisioned
from agentreach.broker.streams import StoredMessage
from agentreach.broker.topology import BucketSpec, Outcome, StreamSpec, Topology
from agentreach.broker.urls import DEFAULT_URL, redacted, resolve_url, server_list
from agentreach.broker.watch import BucketWatch, Change

__all__ = [
    "DEFAULT_URL",
    "Auth",
    "AuthenticationFailed",
    "Broker",
    "BrokerError",
    "BrokerTimeout",
    "Bucket",
    "BucketSpec",
    "BucketWatch",
    "Change",
    "ConnectError",
    "ConsumerNotFound",
    "ConsumerSpec",
    "ConsumerState",
    "Contended",
    "Delivery",
    "EmbeddedServer",
    "EmbeddedServerError",
    "Entry",
    "Inbound",
    "JetStreamError",
    "Names",
    "NoResponders",
    "NoStreamError",
    "Outcome",
    "ProvisionError",
    "Provisioner",
    "PullConsumer",
    "StoredMessage",
    "StreamNotFound",
    "StreamSpec",
    "SubjectFull",
    "Subscription",
    "Swap",
    "TooLarge",
    "Topology",
    "Unavailable",
    "WrongLastSequence",
    "bind",
    "consumer_state",
    "find_server_binary",
    "follow",
    "provision",
    "read_stream",
    "redacted",
    "resolve_url",
    "server_list",
    "wait_provisioned",
]
