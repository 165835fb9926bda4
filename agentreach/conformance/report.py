"""What a conformance run found: one verdict per clause, printed as a table."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TextIO

from agentreach.errors import ReachError


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"  # the MUSTs hold, a SHOULD does not
    FAIL = "fail"
    SKIP = "skip"


class NotReady(ReachError):
    """The run cannot begin: no coordinator, or the agent is not serving."""


class Failed(Exception):
    """A MUST of the clause does not hold; the message says what was seen instead."""


class Skipped(Exception):
    """The clause cannot be judged in this run; the message says why."""


class Unjudged(Skipped):
    """The agent's own declarations (its card, its consumer) keep the clause from being
    judged: the run does not say it conforms (an agent that broke a clause declared a
    capacity the kit does not fill, and was said to conform)."""


@dataclass
class Verdict:
    """One clause's outcome: ``detail`` on success, or what failed, plus SHOULD warnings."""

    number: str
    name: str
    status: Status
    detail: str
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    unjudged: bool = False  # skipped for what the agent declared (see Unjudged)


@dataclass
class Report:
    """Every verdict of a run, in order."""

    agent_id: str
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No clause failed, and none was left unjudged for what the agent declared
        (warnings and the run's own skips are allowed)."""
        return all(v.status is not Status.FAIL and not v.unjudged for v in self.verdicts)

    def count(self, status: Status) -> int:
        return sum(v.status is status for v in self.verdicts)

    def print_line(self, verdict: Verdict, out: TextIO = sys.stdout) -> None:
        """One clause, as soon as it is judged (a long run shows where it is)."""
        mark = verdict.status.value.upper()
        print(
            f"  {mark:<4} {verdict.number:>3}  {verdict.name:<28} {verdict.detail}"
            f"  ({verdict.seconds:.1f}s)",
            file=out,
            flush=True,
        )
        shown = verdict.warnings[:SHOWN_WARNINGS]
        for warning in shown:
            print(f"{'':>12}should: {warning}", file=out, flush=True)
        if more := len(verdict.warnings) - len(shown):
            print(f"{'':>12}… and {more} more like these", file=out, flush=True)

    def summary(self) -> str:
        parts = [
            f"{self.count(Status.PASS)} passed",
            f"{self.count(Status.FAIL)} failed",
            f"{self.count(Status.WARN)} with warnings",
            f"{self.count(Status.SKIP)} skipped",
        ]
        unjudged = [v.number for v in self.verdicts if v.unjudged]
        verdict = "CONFORMS to agent protocol v1" if self.ok else "DOES NOT CONFORM"
        if unjudged and not self.count(Status.FAIL):
            verdict = f"NOT SHOWN TO CONFORM (its own settings kept {', '.join(unjudged)} unjudged)"
        return f"{self.agent_id}: {verdict} — " + ", ".join(parts)


SHOWN_WARNINGS = 5  # per clause: one missing field warns once per event the kit saw


class Checks:
    """What a clause asserts: a MUST that does not hold fails it at once, a SHOULD that does
    not hold is kept as a warning."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def must(self, holds: bool, message: str) -> None:
        if not holds:
            raise Failed(message)

    def should(self, holds: bool, message: str) -> None:
        if not holds:
            self.warnings.append(message)
