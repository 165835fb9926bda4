"""The chaos accounting itself: every id in exactly one row, and a kill told apart from a bug."""

from __future__ import annotations

from agentreach.envelopes import DeadLetter
from tests.chaos.accounting import Kill, Outage, account
from tests.chaos.recorder import Record

KILLED_PID, LIVE_PID, RESTARTED_PID = 100, 200, 300
KILL = Kill("chaos-a", KILLED_PID, at=50.0)


def run(message_id: str, pid: int, start: float, done: float | None) -> list[Record]:
    records = [Record("start", message_id, 1, pid, "chaos-a", start)]
    if done is not None:
        records.append(Record("done", message_id, 1, pid, "chaos-a", done))
    return records


def letter(message_id: str, reason: str) -> DeadLetter:
    return DeadLetter(v=1, reason=reason, message_id=message_id, trace_id=message_id, topic="t")


def test_each_id_lands_in_exactly_one_row() -> None:
    """Once, twice on a live agent, twice after a kill, dead-lettered, lost: one row each."""
    records = [
        *run("once", LIVE_PID, 10.0, 10.1),
        *run("twice", LIVE_PID, 10.0, 10.1),
        *run("twice", LIVE_PID, 16.0, 16.1),
        *run("cut", KILLED_PID, 49.9, None),
        *run("cut", RESTARTED_PID, 56.0, 56.1),
        *run("cut-and-rerun", KILLED_PID, 49.5, 49.6),
        *run("cut-and-rerun", RESTARTED_PID, 56.0, 56.1),
    ]
    letters = [letter("expired", "expired"), letter("ran-and-expired", "expired")]
    records += run("ran-and-expired", LIVE_PID, 1.0, 1.1)
    ids = ["once", "twice", "cut", "cut-and-rerun", "expired", "ran-and-expired", "lost"]
    result = account(ids, records, letters, [KILL])
    assert result.completed_once == ["once", "cut"]
    assert result.duplicated_other == ["twice"]
    assert result.duplicated_killed == ["cut-and-rerun"]  # done 0.4 s before the kill
    assert result.completed_and_dlq_other == ["ran-and-expired"]
    assert result.dlq == {"expired": 1}
    assert result.lost == ["lost"]
    assert sum(n for label, n in result.rows() if label != "sent") == result.sent == len(ids)


def test_a_run_long_finished_before_the_kill_is_not_excused() -> None:
    """A run that finished well before its process was killed, then ran again, is a defect."""
    records = [*run("m", KILLED_PID, 10.0, 10.1), *run("m", RESTARTED_PID, 56.0, 56.1)]
    result = account(["m"], records, [], [KILL])
    assert result.duplicated_other == ["m"]


def test_records_and_letters_of_unknown_ids_are_counted_apart() -> None:
    """What was never sent is not counted as sent, but is reported."""
    result = account(["m"], run("m", LIVE_PID, 1.0, 1.1) + run("x", LIVE_PID, 1.0, 1.1), [], [])
    assert result.completed_once == ["m"]
    assert result.unknown_ids == 1


def test_a_torn_line_is_ignored() -> None:
    """A line cut short by a kill -9 mid-write parses as nothing."""
    line = Record("done", "m", 2, 7, "chaos-a", 1.5).line()
    assert Record.parse(line) == Record("done", "m", 2, 7, "chaos-a", 1.5)
    assert Record.parse(line[:12]) is None


def test_a_run_whose_outcome_waited_out_an_outage_until_the_kill_is_excused() -> None:
    """Done before a server outage that lasted until its process was killed: not recordable."""
    records = [*run("m", KILLED_PID, 40.0, 40.1), *run("m", RESTARTED_PID, 56.0, 56.1)]
    result = account(["m"], records, [], [KILL], [Outage(40.2, 49.5)])
    assert result.duplicated_killed == ["m"]


def test_a_run_whose_process_had_not_reconnected_by_the_kill_is_excused() -> None:
    """The server back 2.7 s before the kill, but the process still reconnecting: its outcome
    could not be recorded, so the run again is the kill's doing (a chaos run at 61678c8)."""
    records = [*run("m", KILLED_PID, 40.0, 40.1), *run("m", RESTARTED_PID, 56.0, 56.1)]
    server_down = [Outage(40.2, 47.3)]
    assert account(["m"], records, [], [KILL], server_down).duplicated_other == ["m"]
    reconnecting = {KILLED_PID: [Outage(40.2, 50.0)], LIVE_PID: [Outage(40.2, 41.0)]}
    result = account(["m"], records, [], [KILL], server_down, reconnecting)
    assert result.duplicated_killed == ["m"]


def test_connected_time_counts_overlapping_outages_once() -> None:
    """Time away is the union of the server's outage and the process's own: 0.5 s up in all."""
    records = [*run("m", KILLED_PID, 46.0, 46.5), *run("m", RESTARTED_PID, 56.0, 56.1)]
    overlapping = {KILLED_PID: [Outage(47.5, 49.0), Outage(47.0, 48.0)]}
    result = account(["m"], records, [], [KILL], [Outage(48.5, 50.0)], overlapping)
    assert result.duplicated_killed == ["m"]  # up 46.5-47.0 only
    apart = {KILLED_PID: [Outage(47.0, 47.5)]}
    result = account(["m"], records, [], [KILL], [Outage(49.5, 50.0)], apart)
    assert result.duplicated_other == ["m"]  # up 0.5 + 2.0 s: long enough to record
