"""Where in the YAML file: a key given twice in one mapping (the YAML loader keeps the last
one silently, so a second `workflows:` section, or a second workflow of one name, would
replace the first without a word), and the line of a value a decoder's error names."""

from __future__ import annotations

import re

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def twice_given(raw: bytes) -> str | None:
    """The first key given twice in a mapping of the YAML document ``raw``, said with both
    lines; None when there is none (or the document does not parse: its decoder says why)."""
    try:
        root = yaml.compose(raw, Loader=_Loader)
    except yaml.YAMLError:
        return None
    pending = [root] if root is not None else []
    while pending:
        node = pending.pop()
        if isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            if (said := _repeated(node)) is not None:
                return said
            pending.extend(value for _, value in node.value)
    return None


def _repeated(mapping: yaml.MappingNode) -> str | None:
    first_line: dict[str, int] = {}
    for key, _ in mapping.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        if key.value in first_line:
            return (
                f"key {key.value!r} is given twice in one mapping (lines {first_line[key.value]}"
                f" and {line}): the second would replace the first; keep one"
            )
        first_line[key.value] = line
    return None


def line_of(raw: bytes, path: str) -> int | None:
    """The line of ``path`` (``$.rate_limits.callers.default.rate``, ``$.routing.rules[2]``)
    in the YAML document ``raw``: of its key, or of its item in a list; None when it is not
    there (a key missing, a ``[...]`` unnamed) or the document does not parse."""
    try:
        node: yaml.Node | None = yaml.compose(raw, Loader=_Loader)
    except yaml.YAMLError:
        return None
    where = node
    for step in re.findall(r"\.([\w-]+)|\[(\d+)\]", path.removeprefix("$")):
        where, node = _child(node, *step)
        if node is None:
            return None
    return where.start_mark.line + 1 if where is not None else None


def _child(
    node: yaml.Node | None, key: str, index: str
) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(where ``key`` or ``index`` is written, its value) in ``node``; Nones when it is not."""
    if key and isinstance(node, yaml.MappingNode):
        return next(
            ((k, v) for k, v in node.value if getattr(k, "value", None) == key), (None, None)
        )
    if index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
        return node.value[int(index)], node.value[int(index)]
    return None, None
