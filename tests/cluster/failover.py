"""A failover run: tasks at a steady rate through a 3-node cluster, kill -9 the node leading
``REACH_TASKS`` (and, if asked, a coordinator replica with it), start the node again later,
then account for every message id and measure the election and the gap in the flow.

Shared by ``tests/cluster/test_failover.py`` (CI-sized) and ``bench/cluster.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentreach import ReachClient
from agentreach.broker import BrokerError, Names, Topology
from tests.chaos.accounting import Accounting, account
from tests.chaos.harness import settle
from tests.chaos.observe import InFlight, dead_letters
from tests.chaos.plan import ChaosPlan
from tests.chaos.processes import UnexpectedExit
from tests.chaos.publisher import Clock, Publisher, Say
from tests.chaos.recorder import Record, read_records
from tests.cluster.deployment import DEFAULT_PLACEMENT, FailoverDeployment, wall

# The flow must come back this soon after the last stream the dead node led has a new
# leader: a reconnect, a fetch round, a redelivery after a nak.
RESUME_BOUND_S = 5.0


@dataclass(frozen=True)
class FailoverPlan:
    tasks: int = 1_200
    rate: float = 60.0  # tasks published per second
    work_ms: int = 50
    ttl_ms: int = 120_000
    kill_at_task: int = 400
    down_s: float = 12.0  # from the kill to the node's restart
    # Also kill -9 a coordinator replica with the node (started again with it): the one not
    # connected to the node, so that the replica left has to reconnect and do all the work.
    kill_coordinator: bool = False
    settle_timeout_s: float = 120.0

    def chaos_plan(self) -> ChaosPlan:
        """What the chaos suite's publisher and settling read from a plan."""
        return ChaosPlan(
            tasks=self.tasks,
            rate=self.rate,
            work_ms=self.work_ms,
            ttl_ms=self.ttl_ms,
            settle_timeout_s=self.settle_timeout_s,
        )


@dataclass
class Failover:
    """What happened at the kill, in seconds after it."""

    victim: str = ""
    killed_at: float = 0.0  # wall clock
    led: list[str] = field(default_factory=list)  # streams the victim led
    tasks_elected_s: float | None = None  # REACH_TASKS has a new leader
    all_elected_s: float | None = None  # every stream the victim led has one
    restarted_s: float | None = None
    caught_up_s: float | None = None  # the restarted node is healthy (its replicas current)
    log: list[str] = field(default_factory=list)


@dataclass
class FailoverReport:
    plan: FailoverPlan
    failover: Failover
    accounting: Accounting
    gap_s: float | None  # the longest time without a completion, from the kill on
    unsent: int
    exits: list[UnexpectedExit]
    unsettled: str | None
    in_flight: InFlight | None
    elapsed_s: float
    workdir: Path

    @property
    def resumed_after_election_s(self) -> float | None:
        """How long after the last election the flow came back (the gap's excess)."""
        f = self.failover
        if self.gap_s is None or f.all_elected_s is None:
            return None
        return max(0.0, self.gap_s - f.all_elected_s)

    def problems(self) -> list[str]:
        a, f = self.accounting, self.failover
        found = [f"{self.unsent} tasks could not be published"] if self.unsent else []
        if a.lost:
            found.append(f"{len(a.lost)} lost (neither completed nor dead-lettered):")
            found.append(a.examples(a.lost))
        if a.duplicated_other or a.duplicated_killed:
            twice = a.duplicated_other + a.duplicated_killed
            found += [f"{len(twice)} ran more than once:", a.examples(twice)]
        if a.completed_and_dlq_other:
            found.append(f"{len(a.completed_and_dlq_other)} completed and also dead-lettered")
        if f.all_elected_s is None:
            found.append("no new leader for every stream the killed node led")
        resumed = self.resumed_after_election_s
        if resumed is None or resumed > RESUME_BOUND_S:
            found.append(
                f"the flow came back {resumed} s after the elections (bound {RESUME_BOUND_S} s)"
            )
        found += [str(e) for e in self.exits]
        if self.unsettled:
            found.append(f"{self.unsettled}; still in flight: {self.in_flight}")
        return found

    def figures(self) -> str:
        f = self.failover
        return (
            f"election of REACH_TASKS {_s(f.tasks_elected_s)}, of every stream {f.victim} led"
            f" ({len(f.led)}) {_s(f.all_elected_s)}; longest gap without a completion"
            f" {_s(self.gap_s)}, i.e. flow back {_s(self.resumed_after_election_s)} after the"
            f" last election; node restarted at {_s(f.restarted_s)}, caught up"
            f" {_s(f.caught_up_s)} later"
        )

    def render(self) -> str:
        p = self.plan
        head = (
            f"failover run: {p.tasks:,} tasks at {p.rate:g}/s on a 3-node cluster, kill -9 of the"
            f" REACH_TASKS leader after task {p.kill_at_task:,}"
            + (" and of a coordinator replica" if p.kill_coordinator else "")
            + f"; {self.elapsed_s:.1f} s"
        )
        lines = [head, "timeline:", *(f"  {entry}" for entry in self.failover.log)]
        lines += ["figures:", f"  {self.figures()}", "accounting:", self.accounting.table()]
        if problems := self.problems():
            lines.append("problems:")
            lines += [f"  {line}" for problem in problems for line in problem.splitlines()]
            lines.append(f"logs: {self.workdir / 'logs'}")
        return "\n".join(lines)


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.2f} s"


async def run_failover(
    plan: FailoverPlan, workdir: Path, *, say: Say = lambda _: None
) -> FailoverReport:
    """Run ``plan`` in ``workdir`` (stores, records, logs); everything started is stopped."""
    clock, failover = Clock(), Failover()
    chaos_plan = plan.chaos_plan()
    placement = dict(DEFAULT_PLACEMENT)
    async with FailoverDeployment(workdir, placement=placement) as deployment:
        say(f"[{clock}] cluster up: {deployment.url}")
        async with ReachClient(deployment.url, name="failover-publisher") as client:
            publisher = Publisher(client, chaos_plan)
            async with asyncio.TaskGroup() as group:
                group.create_task(publisher.run(say, clock))
                group.create_task(_fail_over(deployment, plan, publisher, failover, clock, say))
            sent = publisher.sent
            unsettled, still = await settle(
                client, deployment.records_dir, chaos_plan, sent, clock, say
            )
            try:
                letters = await dead_letters(client.broker)
            except BrokerError as exc:
                letters = []
                unsettled = "; ".join(filter(None, [f"REACH_DLQ unreadable: {exc}", unsettled]))
    records = read_records(deployment.records_dir)
    return FailoverReport(
        plan=plan,
        failover=failover,
        accounting=account(sent, records, letters, deployment.kills),
        gap_s=longest_gap(records, failover.killed_at),
        unsent=plan.tasks - len(sent),
        exits=deployment.exits,
        unsettled=unsettled,
        in_flight=still,
        elapsed_s=clock.elapsed(),
        workdir=workdir,
    )


async def _fail_over(
    deployment: FailoverDeployment,
    plan: FailoverPlan,
    publisher: Publisher,
    failover: Failover,
    clock: Clock,
    say: Say,
) -> None:
    if not await publisher.reached(plan.kill_at_task):
        return
    cluster, names = deployment.cluster, Names()
    streams = _streams(names)
    leaders = {s: await cluster.leader_of(s) for s in streams}
    victim = leaders[names.tasks_stream]
    assert victim is not None, "REACH_TASKS has no leader before the kill"
    failover.victim = cluster.node_name(victim)
    failover.led = [s for s, node in leaders.items() if node == victim]
    replica = _replica_elsewhere(deployment, victim) if plan.kill_coordinator else None
    began = time.monotonic()
    failover.killed_at = wall()
    await cluster.kill(victim)
    if replica is not None:
        await deployment.kill(replica)

    def note(what: str) -> None:
        entry = f"[{clock}] +{time.monotonic() - began:5.2f} s  {what}"
        failover.log.append(entry)
        say(entry)

    killed = f" and {replica}" if replica else ""
    note(f"kill -9 {failover.victim}{killed}; it led {len(failover.led)} streams")

    async def elected(stream: str) -> float:
        await cluster.wait_leader(stream, not_on=victim)
        return time.monotonic() - began

    elections = await asyncio.gather(*(elected(s) for s in failover.led))
    failover.tasks_elected_s = elections[failover.led.index(names.tasks_stream)]
    failover.all_elected_s = max(elections)
    note(
        f"REACH_TASKS led again after {failover.tasks_elected_s:.2f} s,"
        f" all after {failover.all_elected_s:.2f} s"
    )
    await asyncio.sleep(max(0.0, plan.down_s - (time.monotonic() - began)))  # the outage itself
    failover.restarted_s = time.monotonic() - began
    await cluster.start(victim)
    failover.caught_up_s = time.monotonic() - began - failover.restarted_s
    note(f"{failover.victim} started again; healthy {failover.caught_up_s:.2f} s later")
    if replica is not None:
        pid = await deployment.restart(replica)
        note(f"{replica} started again as pid {pid}")


def _replica_elsewhere(deployment: FailoverDeployment, victim: int) -> str:
    """A coordinator replica not connected to ``victim`` (the first one, if all are)."""
    names = list(deployment.coordinators)
    elsewhere = [n for n in names if deployment.placement.get(n) not in (victim,)]
    return (elsewhere or names)[0]


def _streams(names: Names) -> list[str]:
    """Every stream of the topology, buckets' included."""
    topology = Topology.default(names)
    return [s.name for s in topology.streams] + [b.stream for b in topology.buckets]


def longest_gap(records: Sequence[Record], since: float) -> float | None:
    """The longest time without a completed execution, from ``since`` to the last one."""
    done = sorted(r.at for r in records if r.phase == "done" and r.at >= since)
    if not done:
        return None
    times = [since, *done]
    return max(b - a for a, b in itertools.pairwise(times))
