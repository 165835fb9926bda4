"""The Agent-Reach SDK: write agents, invoke them, handle dead letters.

Everything here is re-exported from :mod:`agentreach`.
"""

from agentreach.agents.agent import Agent, HandlerSpec
from agentreach.agents.client import ReachClient
from agentreach.agents.compensation import Compensation, CompensationWorker
from agentreach.agents.context import TaskContext
from agentreach.agents.errors import (
    AgentConfigError,
    AgentIdInUse,
    BacklogFull,
    DeadlineExceeded,
    InvalidArgument,
    InvokeError,
    LetterSettled,
    NotAcknowledged,
    NothingToReplay,
    NotProvisioned,
    NotStored,
    PermanentError,
    Rejected,
    ReplayLimitReached,
    SyncCallOnLoop,
    TaskFailed,
    UnexpectedResult,
    UnknownWorkflow,
    WorkflowActionRefused,
)
from agentreach.agents.manual import ManualReview, ManualReviewError
from agentreach.agents.runtime import AgentRuntime
from agentreach.agents.workflow_control import SignalOutcome, WorkflowEnded

__all__ = [
    "Agent",
    "AgentConfigError",
    "AgentIdInUse",
    "AgentRuntime",
    "BacklogFull",
    "Compensation",
    "CompensationWorker",
    "DeadlineExceeded",
    "HandlerSpec",
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
    "ReachClient",
    "Rejected",
    "ReplayLimitReached",
    "SignalOutcome",
    "SyncCallOnLoop",
    "TaskContext",
    "TaskFailed",
    "UnexpectedResult",
    "UnknownWorkflow",
    "WorkflowActionRefused",
    "WorkflowEnded",
]
