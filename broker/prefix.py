"""The prefix of every name Agent-Reach uses on the broker (``reach``): one subject token
that is also part of stream and bucket names (with a dot, `A.B_TASKS` is no stream name)."""

from __future__ import annotations

import re
from typing import Final

PREFIX_PATTERN: Final = r"^[A-Za-z0-9_-]{1,32}$"
_PREFIX = re.compile(PREFIX_PATTERN)


def prefix_problem(prefix: str) -> str | None:
    """What is wrong with ``prefix`` as the prefix of every name, or None."""
    if isinstance(prefix, str) and _PREFIX.fullmatch(prefix):
        return None
    return (
        f"prefix {prefix!r} is not one name token: 1 to 32 letters, digits, '_' or '-'"
        " (it begins every subject, stream and bucket name)"
    )
