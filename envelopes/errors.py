"""Errors raised by the envelope layer.

EnvelopeError                 root of everything this package raises (a ReachError)
└── DecodeError               bytes or headers that are not a valid envelope v1
"""

from __future__ import annotations

import re

from agentreach.errors import ReachError

_PATH = re.compile(r" - at `(?P<path>[^`]+)`$")


class EnvelopeError(ReachError):
    """Root of the envelope package's exceptions."""


class DecodeError(EnvelopeError):
    """A message is not a valid envelope; the text names what is wrong and where.

    ``path`` is the JSON path of the offending field (``$.ttl_ms``), a header name
    (``header Reach-TTL``), or ``$`` when the document as a whole is wrong.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        match = _PATH.search(message)
        if match is None:
            path = path or "$"
            message = f"{message} - at `{path}`"
        super().__init__(message)
        self.message = message
        self.path = path or (match.group("path") if match else "$")
