"""Seals on the records only the coordinator writes, so that a record it reads is one it wrote.

nats-server sends its answer to a request to whatever reply subject the request names,
checked against no permission. A party may so have the server write onto a key of a bucket
it may not write itself: a direct get of a key of its own, holding content it chose, aimed
at ``$KV.reach_leases.liveness`` reads back as a lease nobody holds and no replica may take;
a delete marker of its own, aimed at a quota record, reads back as a fresh quota. Read by a
direct get, the stored copy loses the headers that would give it away (the server puts its
own ``Nats-*`` headers in their place).

With the coordinator replicas' seal key, every write to a sealed bucket (values and delete
markers) carries ``Reach-Record-Seal``: an HMAC of the key's subject, the operation and the
value. A read that finds no valid seal treats the record as unreadable. Without a key (an
open development server, where everyone is trusted) nothing is sealed or checked.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentreach.broker.names import Names

RECORD_SEAL = "Reach-Record-Seal"
KV_OPERATION = "KV-Operation"
# What every value a party writes carries (a delete marker has its KV-Operation). The server
# copies a stored message to any subject a direct get names as its reply, with no headers
# when asked for none (`no_hdr`): where the buckets' writers all write headers, a value with
# none is such a copy (protocol open point 12). See :func:`headed_buckets`.
RECORD_HEADERS = {"Reach-Kind": "record"}
# What such a value is, said where a secured party skips it (an upgrade meets it too).
HEADERLESS_VALUE = (
    "a value with no headers: a direct get's bare copy (no_hdr) someone aimed at the key, or"
    " the write of a client older than protocol revision 34 (an agent's SDK, a script's"
    " `nats kv put`), which a secured deployment does not read"
)
SEAL_LENGTH = 32  # hex characters: 128 bits of the HMAC


class RecordSeal:
    """Seals and checks the records of the buckets sealed with ``key``."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def seal(self, subject: str, data: bytes, operation: str = "PUT") -> str:
        """The seal of ``data`` written to ``subject`` as ``operation`` (PUT, DEL, PURGE)."""
        mac = hmac.new(self._key, f"{subject}\n{operation}\n".encode(), hashlib.sha256)
        mac.update(data)
        return mac.hexdigest()[:SEAL_LENGTH]

    def headers(self, subject: str, data: bytes, operation: str = "PUT") -> dict[str, str]:
        """The headers a write of ``data`` to ``subject`` carries (with the operation's)."""
        sealed = {RECORD_SEAL: self.seal(subject, data, operation)}
        return sealed if operation == "PUT" else {KV_OPERATION: operation, **sealed}

    def holds(self, subject: str, data: bytes, headers: Mapping[str, str] | None) -> bool:
        """Whether ``data`` stored at ``subject`` with ``headers`` is as a replica wrote it."""
        given = (headers or {}).get(RECORD_SEAL)
        if not isinstance(given, str):
            return False
        operation = (headers or {}).get(KV_OPERATION, "PUT")
        return hmac.compare_digest(given, self.seal(subject, data, operation))


def headed_buckets(names: Names) -> frozenset[str]:
    """The buckets a secured deployment reads no value without headers from: all of them
    (the sealed ones' values carry their seal). Believed, such a value fenced another agent
    out (heartbeats), took its traffic (a card saying `stopped`), answered for it with
    another's result (a `done` execution record, read as "ran already"), lifted a quarantine
    (liveness), answered someone's review (manual), or widened the agent's own intents."""
    return frozenset(
        (
            names.agents_bucket,
            names.heartbeats_bucket,
            names.liveness_bucket,
            names.executions_bucket,
            names.leases_bucket,
            names.workflows_bucket,
            names.breakers_bucket,
            names.quotas_bucket,
            names.manual_bucket,
            f"{names.prefix}_allowances",
        )
    )
