"""Which entry of a mapping does not fit its declared ``dict[K, V]``: msgspec names a dict's
key only as ``[...]``, so a caller's message or a config error would not say which."""

from __future__ import annotations

import typing
from typing import Any

import msgspec


def first_misfit(entries: Any, declared: Any) -> tuple[Any, Exception] | None:
    """The first key of ``entries`` whose value does not convert to ``declared``'s value
    type, with the error; None when ``declared`` is no ``dict[K, V]`` (or ``entries`` no
    dict), or every value fits."""
    args = typing.get_args(declared)
    if typing.get_origin(declared) is not dict or len(args) != 2 or not isinstance(entries, dict):
        return None
    for key, value in entries.items():
        try:
            msgspec.convert(value, args[1])
        except (msgspec.ValidationError, TypeError) as exc:
            return key, exc
    return None
