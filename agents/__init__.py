"""The Agent-Reach SDK: write agents, invoke them, handle dead letters."""

from agents.agent import Agent, HandlerSpec
from agents.client import ReachClient
from agents.compensation import Compensation, CompensationWorker
from agents.context import TaskContext
from agents.errors import (
    AgentConfigError,
    DeadlineExceeded,
    InvokeError,
    NotAcknowledged,
    PermanentError,
    ReachError,
    Rejected,
    TaskFailed,
)
from agents.runtime import AgentRuntime

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
