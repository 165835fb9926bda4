"""Which workflow a module was building when a definition refused it.

The definitions check themselves as they are built (``wf.chain()`` raises at once), before the
module has given them a name: the name is read from the module's source, around the call that
raised — the dict key (``{"review": wf.chain()}``, ``dict(review=...)``) or the variable
(``review = wf.chain()``, and the key of a dict that holds that variable).
"""

from __future__ import annotations

import ast
import traceback
from collections.abc import Iterator
from pathlib import Path

_DEFINITIONS = "agentreach.coordinator.workflow"  # the builder and the definitions' checks


def raised_by_a_definition(exc: BaseException) -> bool:
    """Whether a workflow definition refused what the module built (its checks raise
    ValueError, which msgspec turns into a path when the definition comes from YAML)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return module.startswith(_DEFINITIONS)


def refused_where(exc: BaseException) -> str:
    """``workflow 'review' (line 5)`` for the definition ``exc`` refused, or ``line 5``
    when the source does not name it; empty when no line of the module is known."""
    frames = _module_frames(exc)
    for frame in reversed(frames):  # from the call that raised out to the module's top
        name = _name_at(frame)
        if name is not None:
            return f"workflow {name!r} (line {frame.lineno})"
    return f"line {frames[-1].lineno}" if frames else ""


def _module_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of the user's code between the import and the definition's check."""
    frames: list[traceback.FrameSummary] = []
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        code = tb.tb_frame.f_code.co_filename
        if not code.startswith("<") and not module.startswith(("agentreach.", "importlib")):
            frames.extend(traceback.extract_tb(tb, limit=1))
        tb = tb.tb_next
    return frames


def _name_at(frame: traceback.FrameSummary) -> str | None:
    """The name given to what is built at ``frame``'s position, read from its source."""
    at = (frame.lineno, frame.colno, frame.end_lineno, frame.end_colno)
    try:
        tree = ast.parse(Path(frame.filename).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    if None in at:
        return None
    named = list(_keyed(tree))
    if frame.name == "<module>":  # a function's variables are its own, not workflow names
        named += [(value, _key_holding(tree, name) or name) for value, name in _assigned(tree)]
    inside = [(node, name) for node, name in named if _contains(node, at)]
    # The innermost: `{"a": wf.chain(...)}` assigned to WORKFLOWS names "a", not WORKFLOWS.
    return min(inside, key=lambda found: _span(found[0]))[1] if inside else None


def _keyed(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Each value a dict literal or ``dict(...)`` holds, with its key."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield value, key.value
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "dict":
            yield from ((kw.value, kw.arg) for kw in node.keywords if kw.arg)


def _assigned(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Each value assigned to a plain variable, with the variable's name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield node.value, target.id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            yield node.value, node.target.id


def _key_holding(tree: ast.Module, variable: str) -> str | None:
    """The key under which a dict literal holds ``variable``: ``{"order": order_flow}``."""
    for value, key in _keyed(tree):
        if isinstance(value, ast.Name) and value.id == variable:
            return key
    return None


def _contains(node: ast.AST, at: tuple[int | None, ...]) -> bool:
    start = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
    end = (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)
    return start <= (at[0], at[1]) and (at[2], at[3]) <= end  # type: ignore[operator]


def _span(node: ast.AST) -> tuple[int, int]:
    lines = (getattr(node, "end_lineno", 0) or 0) - getattr(node, "lineno", 0)
    return lines, (getattr(node, "end_col_offset", 0) or 0) - getattr(node, "col_offset", 0)
