"""Workflow input templates: a string ``"$.a.b"`` stands for the value at that path of
``{"input": <the workflow's payload>, "prev": <the previous output>, <step>: <its output>}``.

A path must name something when its step starts. Which steps it may name is checked when the
definition is loaded (:mod:`.precedence`); what the values hold is known only at run time,
so :func:`render` raises :class:`MissingPath` for a path that names nothing there, and the
step fails with that reason instead of being given ``null``. The one absence that is not a
mistake is a step the step's join went on without (``policy: any`` / ``quorum``,
``on_timeout: partial``): a path into it gives ``null``, and the join's ``missing`` says why.
"""

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


class MissingPath(ValueError):
    """An input path names nothing in what the instance has at the time; ``path`` is it
    (without ``$.``), ``why`` says which part is missing."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"the input path '$.{path}' names nothing: {why}")
        self.path = path


def paths_of(template: Any) -> list[str]:
    """The paths in ``template``, without ``$.`` (``"$.plan.outline"`` → ``plan.outline``)."""
    if isinstance(template, str) and _PATH.match(template):
        return [template[2:]]
    if isinstance(template, dict):
        return [path for value in template.values() for path in paths_of(value)]
    if isinstance(template, list):
        return [path for value in template for path in paths_of(value)]
    return []


def render(template: Any, context: dict[str, Any], skipped: frozenset[str] = frozenset()) -> Any:
    """``template`` with each ``"$.path"`` replaced by its value in ``context``. A path into
    a step in ``skipped`` (one its join went on without: directly, or as ``results.<step>``)
    gives None; any other path that names nothing raises :class:`MissingPath`."""
    if isinstance(template, str) and template.startswith("$."):
        path = template[2:]
        found = lookup(context, path)
        if found is not MISSING:
            return found
        if _into_skipped(path.split("."), skipped):
            return None
        raise MissingPath(path, _why_missing(context, path))
    if isinstance(template, dict):
        return {key: render(value, context, skipped) for key, value in template.items()}
    if isinstance(template, list):
        return [render(value, context, skipped) for value in template]
    return template


def _into_skipped(parts: list[str], skipped: frozenset[str]) -> bool:
    if parts[0] == "results" and len(parts) > 1:
        return parts[1] in skipped
    return parts[0] in skipped


def _why_missing(context: dict[str, Any], path: str) -> str:
    """Which part of ``path`` is missing: the longest part that is there, and the next."""
    parts = path.split(".")
    if parts[0] not in context:
        return f"{parts[0]!r} has no value (it has not completed)"
    for i in range(len(parts) - 1, 0, -1):
        there = lookup(context, ".".join(parts[:i]))
        if there is not MISSING:
            kind = type(there).__name__ if there is not None else "null"
            return f"'$.{'.'.join(parts[:i])}' ({kind}) has no {parts[i]!r}"
    return f"{parts[0]!r} has no value"
