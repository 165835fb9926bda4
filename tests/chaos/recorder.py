"""The chaos suite's agents, each run as its own process:
``reach agent tests.chaos.recorder:agent_a --startup-delay 0`` (and ``agent_b``, ``agent_c``).

Each run of the handler appends a ``start`` line when it begins and a ``done`` line when it
returns to ``$CHAOS_RECORDS/<agent_id>.log``: the side effect that must happen once per task.
Each line is one ``write`` on a file opened for appending, then fsynced, so what a process
wrote survives its kill -9 and the files of a restarted process (same agent id) continue.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentreach import Agent, TaskContext

RECORDS_ENV = "CHAOS_RECORDS"
TOPIC = "chaos_work"
AGENT_IDS = ("chaos-a", "chaos-b", "chaos-c")
# Short beats and ack wait: a killed agent is noticed, and its unacknowledged work comes
# back, within the seconds a CI run can afford.
HEARTBEAT_S = 1.0
ACK_WAIT_S = 5.0
DEADLINE_MS = 5_000

Phase = Literal["start", "done"]


@dataclass(frozen=True, slots=True)
class Record:
    """One line of an agent's record: an execution of ``message_id`` began or finished."""

    phase: Phase
    message_id: str
    attempt: int
    pid: int
    agent_id: str
    at: float  # wall clock, seconds: compared with the harness's own kill times

    def line(self) -> str:
        fields = (self.phase, self.message_id, self.attempt, self.pid, self.agent_id, self.at)
        return "\t".join(map(str, fields)) + "\n"

    @classmethod
    def parse(cls, line: str) -> Record | None:
        """The record on ``line``, or None for a torn or foreign line."""
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 6 or parts[0] not in ("start", "done"):
            return None
        phase, message_id, attempt, pid, agent_id, at = parts
        try:
            return cls(phase, message_id, int(attempt), int(pid), agent_id, float(at))  # type: ignore[arg-type]
        except ValueError:
            return None


def read_records(directory: Path) -> list[Record]:
    """Every record every agent process wrote under ``directory``."""
    found: list[Record] = []
    for path in sorted(directory.glob("*.log")):
        with path.open() as f:
            found += [r for line in f if (r := Record.parse(line)) is not None]
    return found


class RecordFile:
    """Appends records durably; shared by the handler threads of one process."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self._fd: int | None = None
        self._lock = threading.Lock()

    def append(self, phase: Phase, ctx: TaskContext) -> None:
        record = Record(phase, ctx.message_id, ctx.attempt, os.getpid(), self.agent_id, time.time())
        data = record.line().encode()
        with self._lock:
            fd = self._open()
            os.write(fd, data)  # one write per line: appends never interleave
            os.fsync(fd)

    def _open(self) -> int:
        if self._fd is None:
            directory = Path(os.environ[RECORDS_ENV])
            path = directory / f"{self.agent_id}.log"
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd


def recording_agent(agent_id: str) -> Agent:
    """An agent whose one handler sleeps ``payload['work_ms']`` between its two records."""
    agent = Agent(agent_id, heartbeat_interval=HEARTBEAT_S, ack_wait=ACK_WAIT_S)
    records = RecordFile(agent_id)

    @agent.handler(TOPIC, capacity=8, deadline_ms=DEADLINE_MS)
    def work(ctx: TaskContext, payload: dict) -> dict:
        records.append("start", ctx)
        time.sleep(payload.get("work_ms", 0) / 1000)  # the work itself: a kill lands inside it
        records.append("done", ctx)
        return {"done_by": agent_id}

    return agent


agent_a, agent_b, agent_c = (recording_agent(agent_id) for agent_id in AGENT_IDS)
AGENT_OBJECTS = {"chaos-a": "agent_a", "chaos-b": "agent_b", "chaos-c": "agent_c"}
