"""A key given twice in one YAML mapping: the YAML loader keeps the last one silently, so
a second `workflows:` section (or a second workflow of one name) would replace the first
without a word."""

from __future__ import annotations

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
