"""Unguessable ``Nats-Msg-Id`` values: JetStream's dedup is stream-wide, so whoever may
publish into a stream could otherwise suppress a message by publishing its id first."""

from __future__ import annotations

import hashlib
import hmac

MSG_ID = "Nats-Msg-Id"


def sealed_id(msg_id: str, secret: bytes) -> str:
    """``msg_id`` with a MAC only holders of ``secret`` can make: the same for the same id
    (so duplicates still meet), impossible for anyone else to publish first."""
    mac = hmac.new(secret, msg_id.encode(), hashlib.sha256).hexdigest()[:16]
    return f"{msg_id}-{mac}"


def sealed(headers: dict[str, str] | None, secret: bytes | None) -> dict[str, str] | None:
    """``headers`` with its ``Nats-Msg-Id`` sealed, when there is a ``secret``."""
    if secret and headers and MSG_ID in headers:
        return {**headers, MSG_ID: sealed_id(headers[MSG_ID], secret)}
    return headers
