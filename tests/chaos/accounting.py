"""Accounting for every message id of a chaos run, from the agents' own records and REACH_DLQ.

Each id sent ends in exactly one row: completed once, run more than once (told apart by
whether one of its executions was cut by a kill -9), completed *and* dead-lettered, in the
DLQ by reason, or lost (neither run to the end nor dead-lettered).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agentreach.envelopes import DeadLetter
from tests.chaos.recorder import Record

# A handler that returned less than this much connected time of its process before that
# process was killed may not have had the time to record its outcome: running it again is
# the kill's doing, not a defect. Time away from the server (its outage, or the process's
# own reconnect after it) does not count.
KILL_GRACE_S = 2.0
SHOWN = 8  # message ids described per problem in a report


@dataclass(frozen=True)
class Kill:
    """A kill -9: of which service, which process, when (wall clock)."""

    name: str
    pid: int
    at: float


@dataclass(frozen=True)
class Outage:
    """nats-server, or one process's connection to it, was away from ``began`` to ``ended``
    (wall clock)."""

    began: float
    ended: float


@dataclass
class Fate:
    """What happened to one message id."""

    message_id: str
    starts: list[Record] = field(default_factory=list)
    dones: list[Record] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    cut_by_kill: bool = False

    def describe(self) -> str:
        runs = [
            f"{r.phase} {r.agent_id} pid={r.pid} attempt={r.attempt} at={r.at:.3f}"
            for r in sorted(self.starts + self.dones, key=lambda r: r.at)
        ]
        letters = [f"dlq {d.reason}: {d.error.message if d.error else ''}" for d in self.letters]
        return f"{self.message_id}: " + "; ".join(runs + letters or ["no execution, no letter"])


@dataclass
class Accounting:
    """The rows of the accounting table, each a list of message ids (or counts by reason)."""

    sent: int
    completed_once: list[str] = field(default_factory=list)
    duplicated_killed: list[str] = field(default_factory=list)
    duplicated_other: list[str] = field(default_factory=list)
    completed_and_dlq_killed: list[str] = field(default_factory=list)
    completed_and_dlq_other: list[str] = field(default_factory=list)
    dlq: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    cut_by_kill: int = 0
    dead_lettered_twice: int = 0
    unknown_ids: int = 0
    fates: dict[str, Fate] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("sent", self.sent),
            ("completed once", len(self.completed_once)),
            ("duplicated (killed agent)", len(self.duplicated_killed)),
            ("duplicated (other)", len(self.duplicated_other)),
            ("completed and dead-lettered (killed agent)", len(self.completed_and_dlq_killed)),
            ("completed and dead-lettered (other)", len(self.completed_and_dlq_other)),
            *([(f"DLQ {reason}", n) for reason, n in sorted(self.dlq.items())] or [("DLQ", 0)]),
            ("lost", len(self.lost)),
        ]

    def notes(self) -> list[tuple[str, int]]:
        return [
            ("ids cut short by a kill (or done < 2 s connected before)", self.cut_by_kill),
            ("ids dead-lettered more than once", self.dead_lettered_twice),
            ("records or letters of ids never sent", self.unknown_ids),
        ]

    def table(self) -> str:
        width = max(len(label) for label, _ in self.rows() + self.notes())
        lines = [f"  {label:<{width}}  {n:>7,}" for label, n in self.rows()]
        lines.append(f"  {'-' * (width + 9)}")
        lines += [f"  {label:<{width}}  {n:>7,}" for label, n in self.notes()]
        return "\n".join(lines)

    def examples(self, ids: Iterable[str]) -> str:
        return "\n".join(f"    {self.fates[i].describe()}" for i in list(ids)[:SHOWN])


def account(
    sent: Iterable[str],
    records: Iterable[Record],
    letters: Iterable[DeadLetter],
    kills: list[Kill],
    outages: Sequence[Outage] = (),
    away: Mapping[int, Sequence[Outage]] | None = None,
) -> Accounting:
    """Put every id of ``sent`` in its row. ``outages`` are the server's, ``away`` each
    process's own time without a connection, by pid."""
    sent = list(sent)
    fates = {message_id: Fate(message_id) for message_id in sent}
    unknown: set[str] = set()
    for record in records:
        fate = fates.get(record.message_id)
        if fate is None:
            unknown.add(record.message_id)
            continue
        (fate.starts if record.phase == "start" else fate.dones).append(record)
    for letter in letters:
        if (fate := fates.get(letter.message_id)) is None:
            unknown.add(letter.message_id)
        else:
            fate.letters.append(letter)
    killed_at = {kill.pid: kill.at for kill in kills}
    down = {pid: [*outages, *(away or {}).get(pid, ())] for pid in killed_at}
    result = Accounting(sent=len(sent), fates=fates, unknown_ids=len(unknown))
    for fate in fates.values():
        fate.cut_by_kill = any(_cut(fate, start, killed_at, down) for start in fate.starts)
        result.cut_by_kill += fate.cut_by_kill
        result.dead_lettered_twice += len(fate.letters) > 1
        _place(result, fate)
    return result


def _cut(
    fate: Fate, start: Record, killed_at: dict[int, float], down: dict[int, list[Outage]]
) -> bool:
    """Did the kill of ``start``'s process interrupt it before its outcome could be recorded?"""
    if start.pid not in killed_at:
        return False
    finished = [d.at for d in fate.dones if d.pid == start.pid and d.at >= start.at]
    if not finished:
        return True
    return _up_time(min(finished), killed_at[start.pid], down[start.pid]) < KILL_GRACE_S


def _up_time(began: float, ended: float, outages: Sequence[Outage]) -> float:
    """Seconds of ``began``..``ended`` outside every one of ``outages`` (which may overlap)."""
    up, at = 0.0, began
    for outage in sorted(outages, key=lambda o: o.began):
        if outage.began > at:
            up += min(outage.began, ended) - at
        at = max(at, outage.ended)
        if at >= ended:
            return up
    return up + ended - at


def _place(result: Accounting, fate: Fate) -> None:
    done, message_id = len(fate.dones), fate.message_id
    if done and fate.letters:
        row = (
            result.completed_and_dlq_killed if fate.cut_by_kill else result.completed_and_dlq_other
        )
        row.append(message_id)
    elif done > 1:
        (result.duplicated_killed if fate.cut_by_kill else result.duplicated_other).append(
            message_id
        )
    elif done == 1:
        result.completed_once.append(message_id)
    elif fate.letters:
        result.dlq[fate.letters[-1].reason] += 1
    else:
        result.lost.append(message_id)
