"""Agent-Reach: reliable reach between AI agents over NATS JetStream.

    from agentreach import Agent, TaskContext, ReachClient, CompensationWorker

The packages below this one: ``agentreach.envelopes`` (the wire types and codec),
``agentreach.broker`` (the NATS layer), ``agentreach.agents`` (the SDK, re-exported
here), ``agentreach.coordinator`` (the service) and ``agentreach.cli`` (``reach``).
"""

from agentreach.agents import (
    Agent,
    AgentConfigError,
    Compensation,
    CompensationWorker,
    DeadlineExceeded,
    InvalidArgument,
    InvokeError,
    ManualReview,
    ManualReviewError,
    NotAcknowledged,
    PermanentError,
    ReachClient,
    Rejected,
    TaskContext,
    TaskFailed,
)
from agentreach.envelopes import DeadLetter, RateLimit, Task
from agentreach.errors import ReachError

__all__ = [
    "Agent",
    "AgentConfigError",
    "Compensation",
    "CompensationWorker",
    "DeadLetter",
    "DeadlineExceeded",
    "InvalidArgument",
    "InvokeError",
    "ManualReview",
    "ManualReviewError",
    "NotAcknowledged",
    "PermanentError",
    "RateLimit",
    "ReachClient",
    "ReachError",
    "Rejected",
    "Task",
    "TaskContext",
    "TaskFailed",
]
