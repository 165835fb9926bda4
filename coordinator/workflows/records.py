"""The workflow records a replica wrote last, kept so that an instance's next change needs
no read first.

Every message of an instance is applied with a conditional write, so a kept copy cannot make
a wrong write: the write names the revision the copy was written at, and fails when another
replica (or this one, before a restart) wrote since; the record is then read and the change
judged again. A change that finds nothing to do on the copy is judged again on a fresh read
too, since the copy may be older than the message (a result another replica's dispatch
awaits). Finished instances are not kept: nothing changes them any more.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable

from agentreach.broker import Bucket
from agentreach.broker.bucket import Entry, Swap
from agentreach.coordinator.workflows.turns import Turns
from agentreach.envelopes import ErrorInfo, WorkflowRecord, decode_as, encode

HOT_RECORDS = 4096  # running instances kept; the least recently written goes first
HOT_BYTES = 32 * 1024 * 1024  # and their encoded records together (step outputs are inline)


class HotRecords:
    """The last written revision of each running instance, up to ``limit`` of them and
    ``max_bytes`` together, kept as the bytes the bucket stores (the same codec, so anything
    written can be kept): a change works on a copy of its own and never edits the kept one."""

    def __init__(self, limit: int = HOT_RECORDS, max_bytes: int = HOT_BYTES) -> None:
        self._limit = limit
        self._max_bytes = max_bytes
        self._bytes = 0
        self._kept: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        # One change of an instance at a time on this replica: changes made together would
        # each lose the race to the one before, and read again (a 300-branch fan-out took
        # 11 s, 124 of its writes losing every race they tried).
        self._turns = Turns()

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, key: str, record: WorkflowRecord, revision: int) -> None:
        """Remember ``record`` as written at ``revision`` (a finished one is forgotten)."""
        self._forget(key)
        if record.finished:
            return
        data = encode(record)
        self._kept[key] = (revision, data)
        self._bytes += len(data)
        while self._kept and (len(self._kept) > self._limit or self._bytes > self._max_bytes):
            self._forget(next(iter(self._kept)))

    def _forget(self, key: str) -> tuple[int, bytes] | None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._bytes -= len(kept[1])
        return kept

    async def cas(
        self,
        bucket: Bucket[WorkflowRecord],
        key: str,
        change: Callable[[WorkflowRecord | None], WorkflowRecord | None],
    ) -> Swap[WorkflowRecord]:
        """:meth:`Bucket.cas` that starts from the kept copy when there is one, after the
        changes of the instance this replica began before it."""
        async with self._turns.turn(key):
            return await self._cas(bucket, key, change)

    async def _cas(
        self,
        bucket: Bucket[WorkflowRecord],
        key: str,
        change: Callable[[WorkflowRecord | None], WorkflowRecord | None],
    ) -> Swap[WorkflowRecord]:
        kept = self._forget(key)  # gone until written again: a failure forgets it
        # "Nothing to change" is checked with the stream's leader: a replica behind (a node
        # paused) showed a step not yet running, and the result that ended it was dropped.
        if kept is None:
            swap = await bucket.cas(key, change, confirm=True)
        else:
            revision, data = kept
            # Overwritten with something unreadable since (anyone may have the server write
            # its answer to a request onto the key): the copy is what this replica wrote
            # last, and the instance goes on from it rather than be lost. Each try gets a
            # record of its own: a change edits the record it is given.
            fresh = functools.partial(decode_as, data, WorkflowRecord)
            known = Entry(key, fresh(), revision)
            swap = await bucket.cas(key, change, known=known, unreadable=fresh)
            if not swap.written:
                swap = await bucket.cas(key, change, unreadable=fresh, confirm=True)
        if swap.written and swap.entry is not None:
            self.keep(key, swap.entry.value, swap.entry.revision)
        return swap


def outgrown_error(exc: Exception) -> ErrorInfo:
    """Why an instance ended whose record would not fit in one message any more."""
    message = (
        f"the instance's record outgrew what the server stores in one message ({exc}): it"
        " keeps the input and every step's input and output inline — send and have steps"
        " return less, or keep large inputs and results elsewhere and pass a reference"
    )
    return ErrorInfo(type="record_too_large", message=message, retryable=False)
