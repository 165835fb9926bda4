"""Driving one agent through every clause of the protocol, in order, and reporting each."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from agentreach import envelopes
from agentreach.broker import Broker, BrokerError, BrokerTimeout, NoResponders
from agentreach.conformance import expiry, lifecycle, registration, run_once, tasks
from agentreach.conformance.process import AgentProcess
from agentreach.conformance.report import (
    Checks,
    Failed,
    NotReady,
    Report,
    Skipped,
    Status,
    Unjudged,
    Verdict,
)
from agentreach.conformance.session import CALLER, Session
from agentreach.envelopes import RegisterRequest

ClauseRun = Callable[[Session, Checks], Awaitable[str]]
CLAUSE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Clause:
    """One numbered clause of docs/protocol.md §18 and the check that judges it; a clause
    that judges what earlier ones left behind ``needs`` at least one of them to have run
    (not skipped) before it in the same run, and is skipped otherwise."""

    number: str
    name: str
    run: ClauseRun
    needs: tuple[str, ...] = ()


CLAUSES = (
    Clause("1", "registration.card", registration.card),
    Clause("2", "registration.consumers", registration.consumers),
    Clause("3", "liveness.probes", registration.probes),
    Clause("4", "liveness.heartbeats", registration.heartbeats),
    Clause("5", "task.ack_and_result", tasks.ack_and_result),
    Clause("6", "task.progress", tasks.progress),
    Clause("7", "task.retryable_error", tasks.retryable_error),
    Clause("8", "task.permanent_error", tasks.permanent_error),
    Clause("9", "task.deadline", tasks.deadline),
    Clause("10", "task.expired", expiry.expired),
    Clause("11", "task.unknown_topic", tasks.unknown_topic),
    Clause("12", "task.invalid_envelope", tasks.invalid_envelope),
    Clause("13", "task.claim_check", tasks.claim_check),
    Clause("14", "run_once.duplicates", run_once.duplicates),
    Clause("15", "run_once.takeover", run_once.takeover),
    Clause("16", "run_once.busy", run_once.busy),
    Clause("17", "fencing.late_result", run_once.fencing),
    Clause("18", "run_once.expiry_fence", run_once.expiry_fence),
    # The agent's events of the task clauses: alone, it has nothing to judge.
    Clause("19", "events.format", tasks.event_format, needs=tuple(str(n) for n in range(5, 19))),
    Clause("20", "identity.one_process", lifecycle.one_process),
    Clause("21", "crash.redelivery", lifecycle.crash),
    Clause("22", "stop.graceful", lifecycle.graceful_stop),
)


async def run_conformance(
    broker: Broker,
    agent_id: str,
    *,
    topic: str = "conformance",
    command: list[str] | None = None,
    only: set[str] | None = None,
    out: TextIO | None = None,
) -> Report:
    """Judge agent ``agent_id`` clause by clause, printing each verdict to ``out``; with its
    ``command`` the kit starts the agent itself, and crashes, restarts and stops it."""
    report = Report(agent_id)
    with tempfile.TemporaryDirectory(prefix="reach-conformance-") as logs:
        process = AgentProcess(command, Path(logs)) if command else None
        session = Session(broker, agent_id, topic, process)
        await session.open()
        try:
            await _preflight(session)
            for clause in CLAUSES:
                if only and clause.name not in only and clause.number not in only:
                    continue
                verdict = _unmet(clause, report) or await _judge(session, clause)
                report.verdicts.append(verdict)
                if out is not None:
                    report.print_line(verdict, out)
        finally:
            if process is not None:
                await process.close()
            await session.close()
    return report


async def _preflight(s: Session) -> None:
    """A coordinator must be running, and the agent serving (started here when given)."""
    request = envelopes.encode(RegisterRequest(agent_id=CALLER))
    subject = s.names.register(CALLER)
    try:
        await s.broker.request(subject, request, timeout=3.0)
    except (NoResponders, BrokerTimeout):
        raise NotReady(f"no coordinator answers {subject}: start one (reach up) first") from None
    if s.process is None:
        try:
            card = await s.card()
        except Failed as exc:
            raise NotReady(f"{exc}: is the agent running? (or give its command after --)") from None
        if card.status != "running":
            raise NotReady(f"{s.agent_id} is not running (its card says {card.status!r})")
        return
    try:
        before = (await s.card()).epoch
    except Failed:
        before = 0  # never registered yet
    await s.process.start()
    try:
        await lifecycle.started(s, after_epoch=before)
    except Failed as exc:
        raise NotReady(f"{exc}; the agent's output:\n{s.process.tail()}") from None


def _unmet(clause: Clause, report: Report) -> Verdict | None:
    """A SKIP verdict when none of the clauses ``clause`` needs ran before it in this run."""
    if not clause.needs:
        return None
    ran = {v.number for v in report.verdicts if v.status is not Status.SKIP}
    if ran.intersection(clause.needs):
        return None
    first, last = clause.needs[0], clause.needs[-1]
    why = (
        f"judges what clauses {first} to {last} leave behind, and none of them ran"
        f" (run it with them, e.g. --only {first},{clause.number})"
    )
    return Verdict(clause.number, clause.name, Status.SKIP, why)


async def _judge(s: Session, clause: Clause) -> Verdict:
    checks = Checks()
    started = time.monotonic()
    unjudged = False
    try:
        async with asyncio.timeout(CLAUSE_TIMEOUT_S):
            detail = await clause.run(s, checks)
        status = Status.WARN if checks.warnings else Status.PASS
    except Failed as exc:
        status, detail = Status.FAIL, str(exc)
    except Skipped as exc:
        status, detail, unjudged = Status.SKIP, str(exc), isinstance(exc, Unjudged)
    except TimeoutError:
        status, detail = Status.FAIL, f"did not finish within {CLAUSE_TIMEOUT_S:g} s"
    except BrokerError as exc:
        status, detail = Status.FAIL, f"broker error: {exc}"
    except Exception as exc:  # a defect of the kit itself: said, and the next clause runs
        status, detail = Status.FAIL, f"the kit failed: {type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
    verdict = Verdict(clause.number, clause.name, status, detail, checks.warnings, seconds)
    verdict.unjudged = status is Status.SKIP and unjudged
    return verdict
