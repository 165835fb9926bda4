"""Which definition an instance runs on: the one it started with, to its end.

A workflow's definition may change while instances of it run (a coordinator restarted with a
step renamed, added or removed). Read by the new definition, an instance would run again a
step it completed under another name, or wait for one its own definition never had; read by
none (the workflow removed), it would stay where it is. So each record carries its definition
and a fingerprint of it from its start, and every change of the instance reads that: the
configuration's definitions serve instances started from now on. It carries the definitions
of the workflows it starts as children too (and theirs): a child removed from the
configuration since still starts, by the definition in force when its parent started.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any

import msgspec
import structlog

from agentreach.coordinator.workflows.nesting import runs
from agentreach.coordinator.workflows.spec import WorkflowSpec
from agentreach.envelopes import WorkflowRecord

log = structlog.get_logger("coordinator.workflows")


def warn_of_unused_parts(specs: Mapping[str, WorkflowSpec]) -> None:
    """Log each part of a definition never used: it works, though not as written."""
    for name, spec in specs.items():
        for warning in spec.warnings():
            log.warning("workflow definition has a part never used", workflow=name, warning=warning)


def fingerprint(spec: WorkflowSpec) -> str:
    """A short id of ``spec``'s content: equal definitions, wherever built, have the same."""
    return hashlib.sha256(msgspec.json.encode(spec)).hexdigest()[:16]


def as_stored(spec: WorkflowSpec) -> dict[str, Any]:
    """``spec`` as a record keeps it: the YAML form, defaults left out (so a default changed
    in a later release applies to the instances running when it is deployed)."""
    return msgspec.to_builtins(spec)  # type: ignore[no-any-return]


def called_by(name: str, specs: Mapping[str, WorkflowSpec]) -> dict[str, dict[str, Any]]:
    """The stored definitions of the workflows ``name`` starts as children, and of those
    they start in turn (``specs`` has no loop: :func:`check_nesting` refused it)."""
    found: dict[str, dict[str, Any]] = {}
    todo = [name]
    while todo:
        for intent in runs(specs[todo.pop()]):
            if intent in specs and intent not in found:
                found[intent] = as_stored(specs[intent])
                todo.append(intent)
    return found


class Definitions:
    """The configured definitions (for new instances) and every one an instance was seen to
    run on (read from its record once, then kept by fingerprint)."""

    def __init__(self, specs: Mapping[str, WorkflowSpec]) -> None:
        self.current = dict(specs)
        self._ids = {name: fingerprint(spec) for name, spec in specs.items()}
        self._known = {self._ids[name]: spec for name, spec in specs.items()}
        self._calls = {name: called_by(name, specs) for name in specs}
        # Workflows no longer configured that instances seen run, or start as children.
        self.retired: set[str] = set()

    def calls_of(self, name: str) -> dict[str, dict[str, Any]]:
        """What a new instance of the configured workflow ``name`` keeps of its children."""
        return self._calls[name]

    def children(self, record: WorkflowRecord) -> Collection[str]:
        """The workflows a step of ``record``'s instance starts as a child instance."""
        return self.current.keys() if record.calls is None else record.calls.keys()

    def seen(self, record: WorkflowRecord) -> None:
        """Keep which workflows no longer configured ``record``'s instance runs or starts."""
        self.retired.update(
            name for name in (record.workflow, *self.children(record)) if name not in self.current
        )

    def child_of(self, parent: WorkflowRecord, name: str) -> WorkflowSpec | None:
        """The definition of the child ``name`` as kept by its ``parent``, when it no longer
        is configured (None when the parent kept none, or it cannot be read)."""
        if name in self.current or parent.calls is None or name not in parent.calls:
            return None
        try:
            return msgspec.convert(parent.calls[name], WorkflowSpec)
        except (msgspec.ValidationError, ValueError) as exc:
            log.error(
                "a child's workflow definition kept by its parent cannot be read",
                workflow=name,
                parent=parent.instance_id,
                error=str(exc),
            )
            return None

    def of(self, record: WorkflowRecord) -> WorkflowSpec | None:
        """The definition ``record``'s instance runs on; None when it cannot be read (said)."""
        self.seen(record)
        if not record.definition_id:  # started before records kept their definition
            if (spec := self.current.get(record.workflow)) is None:
                log.error(
                    "workflow no longer defined; instance left as is", workflow=record.workflow
                )
            return spec
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
