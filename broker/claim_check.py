"""The claim check: payloads and results too large to travel inline go to the JetStream
Object Store, and the envelope carries a :class:`~agentreach.envelopes.PayloadRef` instead.

LLM prompts and answers get large; carried inline they would make every queue, redelivery,
event and dead letter heavy, and pass the server's largest message. Above
``threshold_bytes`` (256 KiB by default) the encoded JSON is put as the object
``<message_id>/payload`` or ``<message_id>/<attempt>/result`` of the bucket
``reach_payloads`` (putting the same name again stores the same bytes: idempotent), and
every reader checks the SHA-256 before it uses what it got.

On a secured deployment (creds issued by ``reach auth``) the claim check is off, and what
would be stowed travels inline up to the server's ``max_payload``: the store's subjects
cannot be scoped to one party (object names are base64 tokens, and a direct get of the
wildcard ``$O.<bucket>.M.*`` answers with the newest object of anyone), so no party may
read or write it, and an agent could not read what the coordinator stowed for it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import nats.errors
import nats.js.errors

from agentreach import envelopes
from agentreach.broker.auth import PARTIES
from agentreach.broker.connection import Broker
from agentreach.broker.errors import BrokerError, TooLarge, translate
from agentreach.envelopes import PayloadRef, Task

DEFAULT_THRESHOLD = 262_144  # 256 KiB
HEADROOM = 4096  # for an envelope's headers and the other fields beside a large payload


class PayloadUnavailable(BrokerError):
    """A claim-checked payload is gone (expired, deleted) or does not match its digest."""


class ClaimCheck:
    """Stows large payloads and results in the Object Store and fetches them back."""

    def __init__(self, broker: Broker, threshold_bytes: int = DEFAULT_THRESHOLD) -> None:
        self._broker = broker
        self.threshold_bytes = threshold_bytes

    @property
    def in_use(self) -> bool:
        """False on a secured deployment (creds that ``reach auth`` issued, of any role):
        large payloads travel inline there, up to the server's ``max_payload``."""
        return self._broker.auth.role is None

    # -- tasks ---------------------------------------------------------------------------
    async def stow_task(self, task: Task) -> Task:
        """``task`` with a large payload replaced by a reference (else ``task`` itself)."""
        if task.payload_ref is not None or task.payload is None:
            return task
        data = envelopes.encode(task.payload)
        if len(data) <= self.threshold_bytes:
            return task
        if not self.in_use:
            return self._inline(task, len(envelopes.encode(task)))
        # Named by its content too: the same id sent again with another payload (refused as
        # another request) must not replace the bytes the first one's agent is to read.
        ref = await self.put(f"{task.message_id}/payload-{_digest(data)[:16]}", data)
        return msgspec.structs.replace(task, payload=None, payload_ref=ref)

    async def payload_of(self, task: Task) -> Any:
        """The task's payload, fetched from the store when it was claim-checked."""
        if task.payload_ref is None:
            return task.payload
        return envelopes.decode_json(await self.get(task.payload_ref))

    # -- results -------------------------------------------------------------------------
    async def stow_result(self, task: Task, result: Any) -> tuple[Any, PayloadRef | None]:
        """``(result, None)`` when small enough to travel, else ``(None, reference)``."""
        data = envelopes.encode(result)
        if len(data) <= self.threshold_bytes:
            return result, None
        if not self.in_use:
            # An execution record holds an inline result, and its bucket takes no more than
            # the threshold (and a little): the result could be answered but not recorded.
            raise TooLarge(
                f"result of {len(data)} bytes is above the claim-check threshold"
                f" ({self.threshold_bytes} bytes), and a secured deployment has no claim"
                " check: return less (a reference to where the result is kept, say)"
            )
        return None, await self.put(f"{task.message_id}/{task.attempt}/result", data)

    async def result_of(self, result: Any, ref: PayloadRef | None) -> Any:
        """A result, fetched from the store when it was claim-checked."""
        if ref is None:
            return result
        return envelopes.decode_json(await self.get(ref))

    def _inline(self, task: Task, size: int) -> Task:
        """``task`` as it is, when it fits in one message; else a TooLarge that says why."""
        largest = self._broker.max_payload - HEADROOM
        if size <= largest:
            return task
        raise TooLarge(
            f"task {task.message_id} is {size} bytes: above the claim-check threshold"
            f" ({self.threshold_bytes} bytes) and the {largest} bytes a secured deployment"
            " carries inline (the server's max_payload less headers): a secured deployment"
            " has no claim check, so send less or raise max_payload"
        )

    # -- the store -----------------------------------------------------------------------
    async def put(self, name: str, data: bytes) -> PayloadRef:
        bucket = self._broker.names.payloads_bucket
        try:
            store = await self._broker.js.object_store(bucket)
            await store.put(name, data)
        except nats.js.errors.BucketNotFoundError:
            raise BrokerError(
                f"Object Store bucket {bucket} does not exist: run `reach provision`"
            ) from None
        except nats.errors.Error as exc:
            raise translate(exc, subject=bucket) from exc
        return PayloadRef(bucket=bucket, name=name, size=len(data), sha256=_digest(data))

    async def get(self, ref: PayloadRef) -> bytes:
        kept_in = self._broker.names.payloads_bucket
        if ref.bucket != kept_in:  # a sender's reference is not read from just any bucket
            raise PayloadUnavailable(
                f"{ref.bucket}/{ref.name}: claim checks are kept in the Object Store bucket"
                f" {kept_in}, not {ref.bucket}"
            )
        role = self._broker.auth.role
        if role in PARTIES:  # refused by the server too, but only after a timeout
            raise PayloadUnavailable(
                f"{ref.bucket}/{ref.name} is in the Object Store, which"
                f" {'an' if role[0] in 'aeiou' else 'a'} {role} of a secured deployment may not"
                " read"
            )
        try:
            store = await self._broker.js.object_store(ref.bucket)
            data = (await store.get(ref.name)).data or b""
        except nats.js.errors.NotFoundError:
            raise PayloadUnavailable(f"{ref.bucket}/{ref.name} is no longer stored") from None
        except nats.js.errors.DigestMismatchError:
            raise PayloadUnavailable(f"{ref.bucket}/{ref.name} is damaged") from None
        except nats.errors.Error as exc:
            raise translate(exc, subject=ref.bucket) from exc
        if _digest(data) != ref.sha256:
            raise PayloadUnavailable(f"{ref.bucket}/{ref.name} does not match its SHA-256")
        return data


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
