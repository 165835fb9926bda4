"""Agent-Reach: reliable reach between AI agents over NATS JetStream.

    from agentreach import Agent, TaskContext, ReachClient, CompensationWorker

Also here, from ``agentreach.broker``: ``Auth`` (credentials) and ``Broker`` (a connection
to share between clients, agents and ``ManualReview``). The package is typed (``py.typed``).
The packages below this one: ``agentreach.envelopes`` (the wire types and codec),
``agentreach.broker`` (the NATS layer), ``agentreach.agents`` (the SDK, re-exported
here), ``agentreach.coordinator`` (the service) and ``agentreach.cli`` (``reach``).
"""

from agentreach.agents import (
    Agent,
    AgentConfigError,
    AgentIdInUse,
    BacklogFull,
    Compensation,
    CompensationWorker,
    DeadlineExceeded,
    InvalidArgument,
    InvokeError,
    LetterSettled,
    ManualReview,
    ManualReviewError,
    NotAcknowledged,
    NothingToReplay,
    NotProvisioned,
    NotStored,
    PermanentError,
    ReachClient,
    Rejected,
    ReplayLimitReached,
    SyncCallOnLoop,
    TaskContext,
    TaskFailed,
    UnexpectedResult,
    UnknownWorkflow,
    WorkflowActionRefused,
    WorkflowEnded,
)
from agentreach.broker import Auth, Broker
from agentreach.envelopes import DeadLetter, RateLimit, Task
from agentreach.errors import ReachError

__all__ = [
    "Agent",
    "AgentConfigError",
    "AgentIdInUse",
    "Auth",
    "BacklogFull",
    "Broker",
    "Compensation",
    "CompensationWorker",
    "DeadLetter",
    "DeadlineExceeded",
    "InvalidArgument",
    "InvokeError",
    "LetterSettled",
    "ManualReview",
    "ManualReviewError",
    "NotAcknowledged",
    "NotProvisioned",
    "NotStored",
    "NothingToReplay",
    "PermanentError",
    "RateLimit",
    "ReachClient",
    "ReachError",
    "Rejected",
    "ReplayLimitReached",
    "SyncCallOnLoop",
    "Task",
    "TaskContext",
    "TaskFailed",
    "UnexpectedResult",
    "UnknownWorkflow",
    "WorkflowActionRefused",
    "WorkflowEnded",
]
