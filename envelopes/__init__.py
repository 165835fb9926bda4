"""Envelope v1: the typed messages of Agent-Reach and their JSON codec."""

from envelopes import headers
from envelopes.cards import AgentCard, Execution, Intent
from envelopes.codec import (
    decode,
    decode_dead_letter,
    decode_event,
    decode_json,
    decode_reply,
    decode_task,
    encode,
)
from envelopes.errors import DecodeError, EnvelopeError
from envelopes.ids import new_id, stable_id
from envelopes.intake import is_envelope, task_from_intake, wrap_body
from envelopes.schema import json_schema
from envelopes.types import (
    PRIORITIES,
    Ack,
    Budget,
    Capacity,
    DeadLetter,
    ErrorInfo,
    ErrorReply,
    Event,
    Message,
    Priority,
    Progress,
    Reply,
    Result,
    Task,
)

__all__ = [
    "PRIORITIES",
    "Ack",
    "AgentCard",
    "Budget",
    "Capacity",
    "DeadLetter",
    "DecodeError",
    "EnvelopeError",
    "ErrorInfo",
    "ErrorReply",
    "Event",
    "Execution",
    "Intent",
    "Message",
    "Priority",
    "Progress",
    "Reply",
    "Result",
    "Task",
    "decode",
    "decode_dead_letter",
    "decode_event",
    "decode_json",
    "decode_reply",
    "decode_task",
    "encode",
    "headers",
    "is_envelope",
    "json_schema",
    "new_id",
    "stable_id",
    "task_from_intake",
    "wrap_body",
]
