"""Kept workflow records on a real bucket: the next change reads nothing, and a kept copy
that another writer overtook never makes a wrong write or drops a change."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from agentreach.broker.bucket import UNREAD, Bucket
from agentreach.coordinator.workflows.records import HotRecords
from agentreach.envelopes import Task, WorkflowRecord, encode, new_id


class CountedReads:
    """The real bucket, counting the compare-and-sets that had to read the key first."""

    def __init__(self, bucket: Bucket[WorkflowRecord]) -> None:
        self.bucket = bucket
        self.reads = 0

    async def cas(self, key: str, change: Any, *, known: Any = UNREAD, **options: Any) -> Any:
        self.reads += known is UNREAD
        return await self.bucket.cas(key, change, known=known, **options)


def record(**fields: Any) -> WorkflowRecord:
    instance_id = new_id()
    task = Task(v=1, message_id=instance_id, trace_id=instance_id, topic="flow")
    return WorkflowRecord(
        instance_id=instance_id, workflow="flow", trace_id=instance_id, task=task, **fields
    )


def appending(value: str):  # type: ignore[no-untyped-def]
    def change(current: WorkflowRecord | None) -> WorkflowRecord | None:
        if current is None:
            return None
        current.path.append(value)  # in place, as a Run changes its record
        return current

    return change


async def kept_record(broker, hot: HotRecords) -> tuple[CountedReads, WorkflowRecord, int]:
    bucket = await broker.bucket(broker.names.workflows_bucket, WorkflowRecord)
    first = record()
    revision = await bucket.create(first.instance_id, first)
    hot.keep(first.instance_id, first, revision)
    return CountedReads(bucket), first, revision


async def test_the_next_change_starts_from_the_kept_copy(broker):
    hot = HotRecords()
    counted, first, _ = await kept_record(broker, hot)
    for value in ("a", "b", "c"):
        assert (await hot.cas(counted, first.instance_id, appending(value))).written  # type: ignore[arg-type]
    assert counted.reads == 0
    stored = await counted.bucket.get(first.instance_id)
    assert stored is not None and stored.value.path == ["a", "b", "c"]


async def test_changes_made_together_take_turns_on_the_kept_copy(broker):
    """A wide fan-out's results arrive together: each change lost the race to the one before
    and read the record again (a 300-branch fan-out took 11 s). They take turns now, each
    from the copy the one before kept, and none is lost."""
    hot = HotRecords()
    counted, first, _ = await kept_record(broker, hot)
    values = [f"branch-{n}" for n in range(40)]
    swaps = await asyncio.gather(
        *(hot.cas(counted, first.instance_id, appending(v)) for v in values)  # type: ignore[arg-type]
    )
    assert all(swap.written for swap in swaps)
    assert counted.reads == 0
    stored = await counted.bucket.get(first.instance_id)
    assert stored is not None and stored.value.path == values


async def test_any_record_the_bucket_takes_is_kept(broker):
    """JSON numbers of any size: the kept copy is in the bucket's own codec."""
    hot = HotRecords()
    counted, first, _ = await kept_record(broker, hot)

    def huge(current: WorkflowRecord | None) -> WorkflowRecord | None:
        return None if current is None else msgspec.structs.replace(current, result=2**70)

    assert (await hot.cas(counted, first.instance_id, huge)).written  # type: ignore[arg-type]
    assert len(hot) == 1
    swap = await hot.cas(counted, first.instance_id, appending("next"))  # type: ignore[arg-type]
    assert swap.entry is not None and swap.entry.value.result == 2**70
    assert counted.reads == 0


async def test_a_copy_another_writer_overtook_is_read_again(broker):
    """The write names the kept revision, fails, and the change is judged on the new record:
    both writers' changes are kept."""
    hot = HotRecords()
    counted, first, revision = await kept_record(broker, hot)
    elsewhere = msgspec.structs.replace(first, path=["elsewhere"])
    await counted.bucket.update(first.instance_id, elsewhere, last=revision)
    swap = await hot.cas(counted, first.instance_id, appending("here"))  # type: ignore[arg-type]
    assert swap.written and swap.entry is not None
    assert swap.entry.value.path == ["elsewhere", "here"]


async def test_nothing_to_do_on_the_copy_is_judged_again_on_a_fresh_read(broker):
    """The kept copy may be older than the message: a step result that another replica's
    change made awaited must not be dropped as "nothing waits for it"."""
    hot = HotRecords()
    counted, first, revision = await kept_record(broker, hot)
    await counted.bucket.update(
        first.instance_id, msgspec.structs.replace(first, current="waiting"), last=revision
    )

    def finish_waiting(current: WorkflowRecord | None) -> WorkflowRecord | None:
        if current is None or current.current != "waiting":
            return None
        return msgspec.structs.replace(current, current="done")

    swap = await hot.cas(counted, first.instance_id, finish_waiting)  # type: ignore[arg-type]
    assert swap.written and swap.entry is not None and swap.entry.value.current == "done"


async def test_a_failed_change_forgets_the_copy(broker):
    hot = HotRecords()
    counted, first, _ = await kept_record(broker, hot)

    def broken(current: WorkflowRecord | None) -> WorkflowRecord | None:
        assert current is not None
        current.path.append("half done")  # edits its copy, then fails
        raise RuntimeError("the change failed")

    with pytest.raises(RuntimeError):
        await hot.cas(counted, first.instance_id, broken)  # type: ignore[arg-type]
    assert len(hot) == 0
    swap = await hot.cas(counted, first.instance_id, appending("after"))  # type: ignore[arg-type]
    assert swap.entry is not None and swap.entry.value.path == ["after"]


def test_the_kept_bytes_are_bounded() -> None:
    big = record(result="x" * 1000)
    hot = HotRecords(max_bytes=2 * len(encode(big)))
    for revision in range(1, 4):
        hot.keep(f"i{revision}", big, revision)
    assert len(hot) == 2
    hot.keep("huge", record(result="x" * 5000), 4)  # bigger than the whole budget
    assert len(hot) == 0


def test_finished_instances_are_not_kept_and_the_oldest_goes_first() -> None:
    hot = HotRecords(limit=2)
    running = [record() for _ in range(3)]
    for revision, each in enumerate(running, start=1):
        hot.keep(each.instance_id, each, revision)
    assert len(hot) == 2
    hot.keep(running[2].instance_id, msgspec.structs.replace(running[2], status="completed"), 9)
    assert len(hot) == 1
