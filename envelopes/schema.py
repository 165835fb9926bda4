"""JSON Schemas (2020-12) of every record on the wire, generated from the msgspec types, for
agents and tools written in other languages.

Each record gets one self-contained schema, named by where it lives under ``schemas/`` in
the repository (``task.json``, ``events/completed.json``, …); ``reach schema --all --out
DIR`` writes them, and a test keeps the committed copies equal to what the types say.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from agentreach.envelopes.audit import AuditRecord
from agentreach.envelopes.coordination import (
    BreakerRecord,
    LeaseRecord,
    QuotaRecord,
    ReloadReply,
    TimerDue,
    WorkflowRecord,
)
from agentreach.envelopes.events import (
    AGENT_EVENTS,
    EVENT_DETAILS,
    WORKER_EVENTS,
    UndecodableDetail,
)
from agentreach.envelopes.executions import Execution
from agentreach.envelopes.manual import ManualItem
from agentreach.envelopes.messages import (
    Ack,
    DeadLetter,
    ErrorReply,
    Event,
    Message,
    Progress,
    Result,
    Routed,
    Task,
)
from agentreach.envelopes.registry import (
    AgentCard,
    AgentControl,
    Heartbeat,
    Liveness,
    RegisterReply,
    RegisterRequest,
    TraceReply,
    TraceRequest,
)

DIALECT = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX = "urn:agent-reach:v1:"
SCHEMA_ID = f"{ID_PREFIX}envelope"


# name → (type, what it is and where it travels)
def _published_by(event: str) -> str:
    if event in AGENT_EVENTS:
        return "published by agents"
    if event in WORKER_EVENTS:
        return "published by compensation workers and operators"
    return "by the coordinator"


RECORDS: dict[str, tuple[Any, str]] = {
    "envelope": (Message, "Any envelope v1, told apart by `kind`."),
    "task": (Task, "A task: on reach.task.<topic> (intake) and reach.agent.<id>.<p> (dispatch)."),
    "ack": (Ack, "Reply to reply_to: the agent accepted the task."),
    "progress": (Progress, "Reply to reply_to: the agent is still working on the task."),
    "result": (Result, "Reply to reply_to: the task completed."),
    "error": (ErrorReply, "Reply to reply_to from the coordinator: the task failed for good."),
    "routed": (Routed, "Reply to reply_to from the coordinator: which agent has this attempt."),
    "event": (
        Event,
        "A lifecycle event on reach.event.<event>.<topic>.<trace_id>.<message_id>.<sender>"
        " (the publisher's id; the coordinator's is `_coordinator`).",
    ),
    "dead_letter": (DeadLetter, "A dead letter on reach.dlq.<reason>.<topic> (REACH_DLQ)."),
    "agent_card": (AgentCard, "An agent's card: KV reach_agents, key = agent_id."),
    "heartbeat": (Heartbeat, "An agent's heartbeat: KV reach_heartbeats, key = agent_id."),
    "liveness": (Liveness, "The coordinator's verdict: KV reach_liveness, key = agent_id."),
    "execution": (
        Execution,
        "A run-once record: KV reach_executions, key = <caller>.<message_id>.<agent_id>"
        " (`_` for no caller).",
    ),
    "register_request": (RegisterRequest, "Request on reach.ctl.register (core request/reply)."),
    "register_reply": (RegisterReply, "The coordinator's answer on reach.ctl.register."),
    "agent_control": (AgentControl, "Coordinator to agent, on reach.ctl.agent.<agent_id>."),
    "trace_request": (TraceRequest, "A caller asks on reach.ctl.trace.<caller> (request)."),
    "trace_reply": (TraceReply, "The coordinator's answer on reach.ctl.trace.<caller>."),
    **{
        f"events/{name}": (
            kind,
            f"The `detail` of a `{name}` event ({_published_by(name)}).",
        )
        for name, kind in sorted(EVENT_DETAILS.items())
    },
    "events/failed_undecodable": (
        UndecodableDetail,
        "The `detail` of a `failed` event about a dispatch that was no task (published by"
        " agents; topic `_invalid`).",
    ),
    "coordination/breaker": (BreakerRecord, "Informative: KV reach_breakers."),
    "coordination/lease": (LeaseRecord, "Informative: KV reach_leases."),
    "coordination/quota": (QuotaRecord, "Informative: KV reach_quotas (key: the caller)."),
    "coordination/manual": (
        ManualItem,
        "Informative: KV reach_manual (key: the task's message id), a task waiting for a person.",
    ),
    "coordination/workflow": (WorkflowRecord, "Informative: KV reach_workflows."),
    "coordination/timer": (TimerDue, "Informative: a workflow timer on reach.wf.timer.<id>."),
    "coordination/reload_reply": (ReloadReply, "Informative: answer on reach.ctl.routes.reload."),
    "coordination/audit": (
        AuditRecord,
        "Informative: an audit record on reach.audit.<status>.<topic>.<trace_id>.<message_id>.",
    ),
}


def json_schema(name: str = "envelope") -> dict[str, Any]:
    """The JSON Schema of record ``name`` (a key of :data:`RECORDS`; default: any envelope,
    discriminated by ``kind``)."""
    kind, description = RECORDS[name]
    generated = _task_kind_optional(_plain_docs(msgspec.json.schema(kind)))
    return {
        "$schema": DIALECT,
        "$id": f"{ID_PREFIX}{name}",
        "title": f"Agent-Reach v1: {name}",
        "description": description,
        **generated,
    }


def all_schemas() -> dict[str, dict[str, Any]]:
    """Every record's schema, by its file name under ``schemas/`` (``events/failed.json``)."""
    return {f"{name}.json": json_schema(name) for name in RECORDS}


def render(schema: dict[str, Any]) -> str:
    """The text a schema file holds: the same bytes for the same types, every time."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def _task_kind_optional(schema: dict[str, Any]) -> dict[str, Any]:
    """A task's ``kind`` may be absent: the decoders (``decode_task``, the TypeScript SDK's)
    take a body without it as a task, so the schema says ``default: "task"`` instead of
    requiring it (writers still write it)."""
    task = schema.get("$defs", {}).get("Task")
    if task is not None:
        task["required"] = [f for f in task.get("required", []) if f != "kind"]
        task["properties"]["kind"] = {**task["properties"]["kind"], "default": "task"}
    return schema


def _plain_docs(value: Any) -> Any:
    """Docstrings use reST literals (``x``); in a schema they read better as Markdown (`x`)."""
    if isinstance(value, dict):
        return {
            k: v.replace("``", "`") if k == "description" and isinstance(v, str) else _plain_docs(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_plain_docs(v) for v in value]
    return value
