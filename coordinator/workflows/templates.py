"""Workflow input templates: a string ``"$.a.b"`` stands for the value at that path of
``{"input": <the workflow's payload>, "prev": <the previous output>, <step>: <its output>}``."""

from __future__ import annotations

import re
from typing import Any

from agentreach.coordinator.conditions import MISSING, lookup

_PATH = re.compile(r"^\$(\.[A-Za-z0-9_-]+)+$")


def check_template(template: Any) -> None:
    """Refuse a ``$`` string that is not a path (``$.name.field``)."""
    if isinstance(template, str) and template.startswith("$") and not _PATH.match(template):
        raise ValueError(f"{template!r} is not a path such as '$.input.topic' or '$.plan.outline'")
    if isinstance(template, dict):
        for value in template.values():
            check_template(value)
    if isinstance(template, list):
        for value in template:
            check_template(value)


def roots_of(template: Any) -> set[str]:
    """The first names of the paths in ``template`` (``"$.plan.outline"`` → ``plan``)."""
    if isinstance(template, str) and _PATH.match(template):
        return {template[2:].split(".", 1)[0]}
    if isinstance(template, dict):
        return set().union(*(roots_of(value) for value in template.values()))
    if isinstance(template, list):
        return set().union(*(roots_of(value) for value in template))
    return set()


def render(template: Any, context: dict[str, Any]) -> Any:
    """``template`` with each ``"$.path"`` replaced by its value in ``context`` (None if absent)."""
    if isinstance(template, str) and template.startswith("$."):
        found = lookup(context, template[2:])
        return None if found is MISSING else found
    if isinstance(template, dict):
        return {key: render(value, context) for key, value in template.items()}
    if isinstance(template, list):
        return [render(value, context) for value in template]
    return template
