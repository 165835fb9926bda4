"""The claim check: payloads and results too large to travel inline go to the JetStream
Object Store, and the envelope carries a :class:`~agentreach.envelopes.PayloadRef` instead.

LLM prompts and answers get large; carried inline they would make every queue, redelivery,
event and dead letter heavy, and pass the server's largest message. Above
``threshold_bytes`` (256 KiB by default) the encoded JSON is put as the object
``<message_id>/payload`` or ``<message_id>/<attempt>/result`` of the bucket
``reach_payloads`` (putting the same name again stores the same bytes: idempotent), and
every reader checks the SHA-256 before it uses what it got.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import nats.errors
import nats.js.errors

from agentreach import envelopes
from agentreach.broker.connection import Broker
from agentreach.broker.errors import BrokerError, translate
from agentreach.envelopes import PayloadRef, Task

DEFAULT_THRESHOLD = 262_144  # 256 KiB


class PayloadUnavailable(BrokerError):
    """A claim-checked payload is gone (expired, deleted) or does not match its digest."""


class ClaimCheck:
    """Stows large payloads and results in the Object Store and fetches them back."""

    def __init__(self, broker: Broker, threshold_bytes: int = DEFAULT_THRESHOLD) -> None:
        self._broker = broker
        self.threshold_bytes = threshold_bytes

    # -- tasks ---------------------------------------------------------------------------
    async def stow_task(self, task: Task) -> Task:
        """``task`` with a large payload replaced by a reference (else ``task`` itself)."""
        if task.payload_ref is not None or task.payload is None:
            return task
        data = envelopes.encode(task.payload)
        if len(data) <= self.threshold_bytes:
            return task
        ref = await self.put(f"{task.message_id}/payload", data)
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
        return None, await self.put(f"{task.message_id}/{task.attempt}/result", data)

    async def result_of(self, result: Any, ref: PayloadRef | None) -> Any:
        """A result, fetched from the store when it was claim-checked."""
        if ref is None:
            return result
        return envelopes.decode_json(await self.get(ref))

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
        return PayloadRef(
            bucket=bucket, name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()
        )

    async def get(self, ref: PayloadRef) -> bytes:
        try:
            store = await self._broker.js.object_store(ref.bucket)
            data = (await store.get(ref.name)).data or b""
        except nats.js.errors.NotFoundError:
            raise PayloadUnavailable(f"{ref.bucket}/{ref.name} is no longer stored") from None
        except nats.js.errors.DigestMismatchError:
            raise PayloadUnavailable(f"{ref.bucket}/{ref.name} is damaged") from None
        except nats.errors.Error as exc:
            raise translate(exc, subject=ref.bucket) from exc
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise PayloadUnavailable(f"{ref.bucket}/{ref.name} does not match its SHA-256")
        return data
