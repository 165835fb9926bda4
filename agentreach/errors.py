"""The one root of every exception Agent-Reach raises, so a program (and the ``reach``
command line) can catch them all with one ``except ReachError``.

    ReachError
    ├── EnvelopeError               agentreach.envelopes: bytes that are not a valid envelope
    │   └── DecodeError
    ├── BrokerError                 agentreach.broker: NATS / JetStream failures, translated
    │   ├── ConnectError            AuthenticationFailed: credentials refused or unusable;
    │   │                           TlsFailed: the TLS handshake failed (certificate not trusted)
    │   ├── BrokerTimeout, NoResponders, NoStreamError, ProvisionError, …
    │   └── JetStreamError          StreamNotFound, ConsumerNotFound, WrongLastSequence, …
    ├── ConfigError                 agentreach.coordinator: a configuration file is wrong
    ├── IntentError                 agentreach.coordinator.routing.intents
    │   └── ScorerUnavailable       a scorer's extra (or model wheel) is not installed
    ├── AgentConfigError            agentreach.agents: an Agent or handler declared wrongly
    ├── InvalidArgument             a ReachClient call got a wrong argument (also a ValueError)
    ├── AgentIdInUse                another live process serves this agent_id
    ├── PermanentError              raised by a handler: do not retry this task
    ├── ReplayLimitReached          a dead letter's task was replayed max_replays times already
    ├── ManualReviewError           ManualReview: the item is gone, closed or held by another
    └── InvokeError                 ReachClient.invoke() got no result
        ├── NotProvisioned          no task stream: run `reach provision` (also a NoStreamError)
        ├── BacklogFull             the caller's backlog on the topic, or the intake, is full
        ├── NotAcknowledged, DeadlineExceeded
        └── TaskFailed
            └── Rejected
"""

from __future__ import annotations


class ReachError(Exception):
    """Root of every exception Agent-Reach raises."""
