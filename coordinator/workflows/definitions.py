"""Which definition an instance runs on: the one it started with, to its end.

A workflow's definition may change while instances of it run (a coordinator restarted with a
step renamed, added or removed). Read by the new definition, an instance would run again a
step it completed under another name, or wait for one its own definition never had; read by
none (the workflow removed), it would stay where it is. So each record carries its definition
and a fingerprint of it from its start, and every change of the instance reads that: the
configuration's definitions serve instances started from now on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec
import structlog

from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import WorkflowRecord

log = structlog.get_logger("coordinator.workflows")


def fingerprint(spec: WorkflowSpec) -> str:
    """A short id of ``spec``'s content: equal definitions, wherever built, have the same."""
    return hashlib.sha256(msgspec.json.encode(spec)).hexdigest()[:16]


def as_stored(spec: WorkflowSpec) -> dict[str, Any]:
    """``spec`` as a record keeps it: the YAML form, defaults left out (so a default changed
    in a later release applies to the instances running when it is deployed)."""
    return msgspec.to_builtins(spec)  # type: ignore[no-any-return]


class Definitions:
    """The configured definitions (for new instances) and every one an instance was seen to
    run on (read from its record once, then kept by fingerprint)."""

    def __init__(self, specs: Mapping[str, WorkflowSpec]) -> None:
        self.current = dict(specs)
        self._ids = {name: fingerprint(spec) for name, spec in specs.items()}
        self._known = {self._ids[name]: spec for name, spec in specs.items()}

    def of(self, record: WorkflowRecord) -> WorkflowSpec | None:
        """The definition ``record``'s instance runs on; None when it cannot be read."""
        if not record.definition_id:  # started before records kept their definition
            return self.current.get(record.workflow)
        if (spec := self._known.get(record.definition_id)) is None:
            spec = self._read(record)
        return spec

    def _read(self, record: WorkflowRecord) -> WorkflowSpec | None:
        try:
            spec = msgspec.convert(record.definition, WorkflowSpec)
        except (msgspec.ValidationError, ValueError) as exc:
            log.error(
                "an instance's own workflow definition cannot be read; instance left as is",
                workflow=record.workflow,
                instance_id=record.instance_id,
                definition_id=record.definition_id,
                error=str(exc),
            )
            return None
        self._known[record.definition_id] = spec
        current = self._ids.get(record.workflow)
        log.info(
            "instances run on the definition they started with, not the configured one",
            workflow=record.workflow,
            definition_id=record.definition_id,
            configured=current or "none (the workflow is no longer defined)",
        )
        return spec
