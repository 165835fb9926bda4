"""JSON Schema of envelope v1, for agents written in other languages."""

from __future__ import annotations

from typing import Any

import msgspec

from agentreach.envelopes.messages import Message

SCHEMA_ID = "urn:agent-reach:envelope:v1"


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of every envelope kind, discriminated by ``kind``."""
    schema = msgspec.json.schema(Message)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Agent-Reach envelope v1",
        **schema,
    }
