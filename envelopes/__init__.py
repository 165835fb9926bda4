"""Envelope v1 and every record on the wire: typed messages, KV records and their JSON codec.

- :mod:`~agentreach.envelopes.messages`: the envelopes (task, ack, progress, result, error,
  event, dead letter);
- :mod:`~agentreach.envelopes.registry`: agent cards, heartbeats, liveness, registration;
- :mod:`~agentreach.envelopes.executions`: run-once execution records;
- :mod:`~agentreach.envelopes.events`: the ``detail`` of each lifecycle event;
- :mod:`~agentreach.envelopes.coordination`: the coordinator's breaker, lease, quota,
  workflow and timer records;
- :mod:`~agentreach.envelopes.manual`: tasks waiting in a manual-review queue;
- :mod:`~agentreach.envelopes.codec`, :mod:`~agentreach.envelopes.intake`,
  :mod:`~agentreach.envelopes.headers`, :mod:`~agentreach.envelopes.schema`,
  :mod:`~agentreach.envelopes.clock`, :mod:`~agentreach.envelopes.ids`.
"""

from agentreach.envelopes import headers, tracecontext
from agentreach.envelopes.audit import AuditRecord, Summary, summarize
from agentreach.envelopes.clock import now_ms, ttl_left_ms
from agentreach.envelopes.codec import (
    decode,
    decode_as,
    decode_dead_letter,
    decode_event,
    decode_json,
    decode_reply,
    decode_task,
    encode,
)
from agentreach.envelopes.coordination import (
    BreakerRecord,
    LeaseRecord,
    QuotaRecord,
    ReloadReply,
    StepRun,
    TimerDue,
    WorkflowRecord,
    breaker_key,
)
from agentreach.envelopes.errors import DecodeError, EnvelopeError
from agentreach.envelopes.events import AGENT_EVENTS, EVENT_DETAILS, decode_detail
from agentreach.envelopes.executions import NO_CALLER, Execution, execution_key, executions_of
from agentreach.envelopes.ids import new_id, stable_id, unix_ms_of
from agentreach.envelopes.intake import is_envelope, task_from_intake, wrap_body
from agentreach.envelopes.manual import ManualItem, ManualStatus
from agentreach.envelopes.messages import (
    DEFAULT_TTL_MS,
    INVALID_TOPIC,
    MAX_TTL_MS,
    PRIORITIES,
    TOKEN_PATTERN,
    Ack,
    Budget,
    Candidate,
    Capacity,
    DeadLetter,
    ErrorInfo,
    ErrorReply,
    Event,
    Message,
    PayloadRef,
    Priority,
    Progress,
    Reply,
    Resolution,
    Result,
    Routed,
    Task,
    is_reply_subject,
    is_token,
)
from agentreach.envelopes.registry import (
    AgentCard,
    AgentControl,
    Heartbeat,
    Intent,
    Liveness,
    LivenessState,
    RateLimit,
    RegisterReply,
    RegisterRequest,
    TraceReply,
    TraceRequest,
)
from agentreach.envelopes.schema import all_schemas, json_schema

__all__ = [
    "AGENT_EVENTS",
    "DEFAULT_TTL_MS",
    "EVENT_DETAILS",
    "INVALID_TOPIC",
    "MAX_TTL_MS",
    "NO_CALLER",
    "PRIORITIES",
    "TOKEN_PATTERN",
    "Ack",
    "AgentCard",
    "AgentControl",
    "AuditRecord",
    "BreakerRecord",
    "Budget",
    "Candidate",
    "Capacity",
    "DeadLetter",
    "DecodeError",
    "EnvelopeError",
    "ErrorInfo",
    "ErrorReply",
    "Event",
    "Execution",
    "Heartbeat",
    "Intent",
    "LeaseRecord",
    "Liveness",
    "LivenessState",
    "ManualItem",
    "ManualStatus",
    "Message",
    "PayloadRef",
    "Priority",
    "Progress",
    "QuotaRecord",
    "RateLimit",
    "RegisterReply",
    "RegisterRequest",
    "ReloadReply",
    "Reply",
    "Resolution",
    "Result",
    "Routed",
    "StepRun",
    "Summary",
    "Task",
    "TimerDue",
    "TraceReply",
    "TraceRequest",
    "WorkflowRecord",
    "all_schemas",
    "breaker_key",
    "decode",
    "decode_as",
    "decode_dead_letter",
    "decode_detail",
    "decode_event",
    "decode_json",
    "decode_reply",
    "decode_task",
    "encode",
    "execution_key",
    "executions_of",
    "headers",
    "is_envelope",
    "is_reply_subject",
    "is_token",
    "json_schema",
    "new_id",
    "now_ms",
    "stable_id",
    "summarize",
    "task_from_intake",
    "tracecontext",
    "ttl_left_ms",
    "unix_ms_of",
    "wrap_body",
]
