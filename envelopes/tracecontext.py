"""W3C Trace Context (``traceparent``): accepted on intake, passed on to every step.

``00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>``. A task keeps the trace id of
the ``traceparent`` it came with; each hop (a dispatch, a workflow step, a child task) gets
a parent id of its own, derived from the message id and attempt, so the same hop always
has the same id and the chain joins the caller's OpenTelemetry trace.
"""

from __future__ import annotations

import hashlib
import re

HEADER = "traceparent"
_PATTERN = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_INVALID_TRACE = "0" * 32
_INVALID_PARENT = "0" * 16


def parse(value: object) -> tuple[str, str, str] | None:
    """``(trace_id, parent_id, flags)`` of a valid version-00 header, else None.

    An invalid header is ignored, as the W3C recommendation asks (a new trace starts).
    """
    if not isinstance(value, str):
        return None
    match = _PATTERN.match(value.strip().lower())
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or trace_id == _INVALID_TRACE or parent_id == _INVALID_PARENT:
        return None
    return trace_id, parent_id, flags


def normalized(value: object) -> str | None:
    """The header in canonical form (version 00, lower case), or None when invalid."""
    parts = parse(value)
    return None if parts is None else f"00-{parts[0]}-{parts[1]}-{parts[2]}"


def child(traceparent: str | None, *hop: object) -> str | None:
    """The ``traceparent`` for one hop below ``traceparent``: same trace, its own parent id
    (the same for the same ``hop``, e.g. message id and attempt)."""
    parts = parse(traceparent)
    if parts is None:
        return None
    trace_id, _, flags = parts
    span = hashlib.blake2b(repr((trace_id, *hop)).encode(), digest_size=8).hexdigest()
    if span == _INVALID_PARENT:
        span = "0" * 15 + "1"
    return f"00-{trace_id}-{span}-{flags}"


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a valid header."""
    parts = parse(traceparent)
    return None if parts is None else parts[0]
