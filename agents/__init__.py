"""The Agent-Reach SDK: write agents, invoke them, handle dead letters."""

from agentreach.agents.agent import Agent, HandlerSpec
from agentreach.agents.client import ReachClient
from agentreach.agents.compensation import Compensation, CompensationWorker
from agentreach.agents.context import TaskContext
from agentreach.agents.errors import (
    AgentConfigError,
    DeadlineExceeded,
    InvokeError,
    NotAcknowledged,
    PermanentError,
    ReachError,
    Rejected,
    TaskFailed,
)
from agentreach.agents.runtime import AgentRuntime

__all__ = [
    "Agent",
    "AgentConfigError",
    "AgentRuntime",
    "Compensation",
    "CompensationWorker",
    "DeadlineExceeded",
    "HandlerSpec",
    "InvokeError",
    "NotAcknowledged",
    "PermanentError",
    "ReachClient",
    "ReachError",
    "Rejected",
    "TaskContext",
    "TaskFailed",
]
