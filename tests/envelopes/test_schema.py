"""The committed JSON Schemas under schemas/: equal to what the types say, and judging
records the way the decoders do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from agentreach import envelopes
from agentreach.envelopes import (
    EVENT_DETAILS,
    AgentCard,
    Budget,
    DecodeError,
    ErrorInfo,
    Execution,
    Heartbeat,
    Intent,
    RegisterReply,
    Task,
)
from agentreach.envelopes.schema import RECORDS, all_schemas, render

SCHEMAS = Path(__file__).parents[2] / "schemas"
REGENERATE = "regenerate them: reach schema --all --out schemas"


def committed() -> dict[str, str]:
    return {str(p.relative_to(SCHEMAS)): p.read_text() for p in SCHEMAS.rglob("*.json")}


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_schemas_are_what_the_types_say():
    """Every record's schema is committed, unchanged, and nothing else is there."""
    generated = {name: render(schema) for name, schema in all_schemas().items()}
    on_disk = committed()
    assert sorted(on_disk) == sorted(generated), REGENERATE
    stale = [name for name in generated if on_disk[name] != generated[name]]
    assert not stale, f"{stale} differ from the types; {REGENERATE}"


def test_every_event_with_a_fixed_detail_has_a_schema():
    """events/<name>.json exists for each event whose detail shape is part of the contract."""
    assert {f"events/{name}" for name in EVENT_DETAILS} <= set(RECORDS)


TASK = Task(
    v=1,
    message_id="m-1",
    trace_id="t-1",
    topic="echo",
    payload={"text": "hi"},
    reply_to="_INBOX.abc",
    budget=Budget(execute_ms=5_000),
)
GOOD: list[tuple[str, Any]] = [
    ("task", TASK),
    ("envelope", TASK),
    ("task", {"v": 1, "kind": "task", "message_id": "m", "trace_id": "t", "topic": "x"}),
    ("agent_card", AgentCard(agent_id="a-1", intents={"echo": Intent(capacity=2)}, epoch=3)),
    ("heartbeat", Heartbeat(agent_id="a-1", epoch=3, seq=7, interval_s=15.0, free_slots=2)),
    ("execution", Execution(message_id="m-1", state="done", agent_id="a-1", result=[1])),
    ("register_reply", RegisterReply(ok=False, retry_after_ms=51)),
    ("events/completed", {"result": None, "duration_ms": 0}),
    ("events/progress", {"note": "half way"}),
    (
        "events/failed",
        {
            "task": msgspec.to_builtins(TASK),
            "error": ErrorInfo(type="ValueError", message="no"),
            "dispatched_at_ms": 1,
        },
    ),
]
BAD: list[tuple[str, dict[str, Any]]] = [
    ("task", {"v": 2, "kind": "task", "message_id": "m", "trace_id": "t", "topic": "x"}),
    ("task", {"v": 1, "kind": "task", "message_id": "a.b", "trace_id": "t", "topic": "x"}),
    (
        "task",
        {
            "v": 1,
            "kind": "task",
            "message_id": "m",
            "trace_id": "t",
            "topic": "x",
            "ttl_ms": 86_400_001,
        },
    ),
    (
        "task",
        {
            "v": 1,
            "kind": "task",
            "message_id": "m",
            "trace_id": "t",
            "topic": "x",
            "reply_to": "$JS.API.x",
        },
    ),
    (
        "task",
        {
            "v": 1,
            "kind": "task",
            "message_id": "m",
            "trace_id": "t",
            "topic": "x",
            "reply_to": "a.*",
        },
    ),
    (
        "task",
        {"v": 1, "kind": "task", "message_id": "m", "trace_id": "t", "topic": "x", "attempt": 0},
    ),
    ("heartbeat", {"v": 1, "agent_id": "a", "seq": 1, "interval_s": 1.0}),
    ("agent_card", {"agent_id": "a", "intents": {}, "status": "gone"}),
    ("events/completed", {"result": 1}),
    ("events/failed", {"error": {"type": "x", "message": "y"}}),
]


@pytest.mark.parametrize(("name", "record"), GOOD, ids=[n for n, _ in GOOD])
def test_records_the_decoders_take_are_valid_by_the_schema(name: str, record: Any) -> None:
    """A record the Python types accept passes its committed schema."""
    document = json.loads(envelopes.encode(record))
    kind = RECORDS[name][0]
    envelopes.decode_as(envelopes.encode(document), kind)
    validator(name).validate(document)


@pytest.mark.parametrize(("name", "record"), BAD, ids=[n for n, _ in BAD])
def test_records_the_decoders_refuse_are_invalid_by_the_schema(
    name: str, record: dict[str, Any]
) -> None:
    """A record the Python types refuse fails its committed schema too."""
    with pytest.raises(DecodeError):
        envelopes.decode_as(envelopes.encode(record), RECORDS[name][0])
    assert list(validator(name).iter_errors(record))
