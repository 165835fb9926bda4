"""The NATS / JetStream layer: connection, names, topology, embedded server."""

from agentreach.broker.connection import DEFAULT_URL, Broker, resolve_url
from agentreach.broker.embedded import EmbeddedServer, find_server_binary
from agentreach.broker.errors import (
    BrokerError,
    BrokerTimeout,
    ConnectError,
    ConsumerNotFound,
    EmbeddedServerError,
    JetStreamError,
    NoStreamError,
    ProvisionError,
    StreamNotFound,
    SubjectFull,
    WrongLastSequence,
)
from agentreach.broker.names import Names
from agentreach.broker.reader import StoredMessage, read_stream
from agentreach.broker.topology import BucketSpec, Outcome, StreamSpec, Topology, provision

__all__ = [
    "DEFAULT_URL",
    "Broker",
    "BrokerError",
    "BrokerTimeout",
    "BucketSpec",
    "ConnectError",
    "ConsumerNotFound",
    "EmbeddedServer",
    "EmbeddedServerError",
    "JetStreamError",
    "Names",
    "NoStreamError",
    "Outcome",
    "ProvisionError",
    "StoredMessage",
    "StreamNotFound",
    "StreamSpec",
    "SubjectFull",
    "Topology",
    "WrongLastSequence",
    "find_server_binary",
    "provision",
    "read_stream",
    "resolve_url",
]
