"""Seed lists as people type them: a malformed entry is quoted as typed, never rewritten,
and never with its password."""

from __future__ import annotations

import re

import pytest

from agentreach.broker import ConnectError
from agentreach.broker.urls import server_list


@pytest.mark.parametrize(
    ("typed", "quoted"),
    [
        ("nats//127.0.0.1:30930", "nats//127.0.0.1:30930"),
        ("nats:/127.0.0.1:23745", "nats:/127.0.0.1:23745"),
        ("nats://ok:4222, 127.0.0.1:42x", "127.0.0.1:42x"),
        ("nats:/alice:secret@127.0.0.1:4222", "nats:/***@127.0.0.1:4222"),
        ("alice:secret@127.0.0.1:42x", "***@127.0.0.1:42x"),
        ("nats://alice:secret@a:42x", "nats://alice:***@a:42x"),
    ],
)
def test_a_malformed_entry_is_quoted_as_it_was_typed(typed: str, quoted: str):
    """The entry is named as the user wrote it (no ``nats://`` put in front of a mistyped
    scheme), with any password or token hidden."""
    with pytest.raises(ConnectError, match=f"^{re.escape(repr(quoted))} is not a NATS server URL"):
        server_list(typed)
