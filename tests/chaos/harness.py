"""A chaos run: publish tasks (and start workflows) at a steady rate through a real
deployment while killing an agent, killing a coordinator and restarting nats-server, then
account for every message id and every workflow instance.

Shared by ``tests/chaos/test_chaos.py`` (CI-sized) and ``bench/chaos.py`` (10,000+ tasks,
faults repeated).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentreach import ReachClient
from agentreach.broker import BrokerError
from tests.chaos.accounting import Accounting, account
from tests.chaos.cluster import ChaosCluster
from tests.chaos.faults import Chaos
from tests.chaos.flows import FlowAccounting, account_flows, flow_records
from tests.chaos.observe import InFlight, Progress, dead_letters
from tests.chaos.plan import ChaosPlan
from tests.chaos.processes import UnexpectedExit
from tests.chaos.publisher import Clock, Publisher, Say
from tests.chaos.recorder import AGENT_IDS, read_records

POLL_S = 0.5  # how often a settling run looks at the broker: no event says "all settled"
SAY_EVERY = 10  # polls between two progress lines
QUIET_POLLS = 2  # consecutive polls with nothing in flight before the run counts as settled
STALLED_S = 45.0  # no id accounted, nothing leaving flight, for this long: it is stuck


@dataclass
class ChaosReport:
    """The outcome of a run: the accounting, and everything that went wrong on the way."""

    plan: ChaosPlan
    accounting: Accounting
    unsent: int
    exits: list[UnexpectedExit]
    fault_log: list[str]
    fault_errors: list[str]
    unsettled: str | None  # why the run did not settle
    in_flight: InFlight | None
    publish_s: float
    publish_retries: int
    elapsed_s: float
    workdir: Path
    flows: FlowAccounting | None = None

    def problems(self) -> list[str]:
        a = self.accounting
        found = [f"{self.unsent} tasks could not be published"] if self.unsent else []
        if a.lost:
            found.append(f"{len(a.lost)} lost (neither completed nor dead-lettered):")
            found.append(a.examples(a.lost))
        if a.duplicated_other:
            found.append(f"{len(a.duplicated_other)} ran twice on agents not killed mid-task:")
            found.append(a.examples(a.duplicated_other))
        if a.completed_and_dlq_other:
            found.append(f"{len(a.completed_and_dlq_other)} completed and also dead-lettered:")
            found.append(a.examples(a.completed_and_dlq_other))
        found += [str(e) for e in self.exits]
        found += self.fault_errors
        if self.unsettled:
            found.append(f"{self.unsettled}; still in flight: {self.in_flight}")
        return found + (self.flows.problems() if self.flows else [])

    def render(self) -> str:
        p = self.plan
        head = (
            f"chaos run: {p.tasks:,} tasks at {p.rate:g}/s, {len(AGENT_IDS)} agents,"
            f" {p.coordinators} coordinators, {p.rounds} round(s) of faults;"
            f" {self.elapsed_s:.1f} s ({self.publish_s:.1f} s publishing and faults,"
            f" {self.publish_retries} publishes retried)"
        )
        lines = [head, "faults:", *(f"  {entry}" for entry in self.fault_log)]
        lines += ["accounting:", self.accounting.table()]
        if self.flows:
            lines += ["workflows:", self.flows.table()]
        if problems := self.problems():
            lines.append("problems:")
            lines += [f"  {line}" for problem in problems for line in problem.splitlines()]
            lines.append(f"logs: {self.workdir / 'logs'}")
        return "\n".join(lines)


async def run_chaos(plan: ChaosPlan, workdir: Path, *, say: Say = lambda _: None) -> ChaosReport:
    """Run ``plan`` in ``workdir`` (store, records, logs); everything started is stopped."""
    clock = Clock()
    async with ChaosCluster(workdir, coordinators=plan.coordinators) as cluster:
        say(f"[{clock}] cluster up: nats-server at {cluster.url}")
        async with ReachClient(cluster.url, name="chaos-publisher") as client:
            publisher = Publisher(client, plan)
            chaos = Chaos(cluster, client.broker, plan, clock, say)
            async with asyncio.TaskGroup() as group:
                group.create_task(publisher.run(say, clock))
                group.create_task(chaos.run(publisher))
            publish_s = clock.elapsed()
            sent, records_dir = publisher.sent, cluster.records_dir
            unsettled, still = await settle(
                client, records_dir, plan, sent, clock, say, flows=publisher.flows
            )
            try:
                letters = await dead_letters(client.broker)
            except BrokerError as exc:
                letters = []
                unsettled = "; ".join(filter(None, [f"REACH_DLQ unreadable: {exc}", unsettled]))
            instances = await flow_records(client.broker, publisher.flows) or {}
    records = read_records(cluster.records_dir)
    kills, outages, away = cluster.kills, cluster.outages, cluster.away
    flows = account_flows(publisher.flows, instances, records, letters, kills, outages, away)
    of_flows = set(publisher.flows) | set(flows.steps.fates)
    records = [r for r in records if r.message_id not in of_flows]
    letters = [d for d in letters if d.message_id not in of_flows]
    return ChaosReport(
        plan=plan,
        accounting=account(publisher.sent, records, letters, kills, outages, away),
        unsent=plan.tasks - len(publisher.sent),
        exits=cluster.exits,
        fault_log=chaos.log,
        fault_errors=chaos.errors,
        unsettled=unsettled,
        in_flight=still,
        publish_s=publish_s,
        publish_retries=publisher.retries,
        elapsed_s=clock.elapsed(),
        workdir=workdir,
        flows=flows if publisher.flows else None,
    )


async def settle(
    client: ReachClient,
    records_dir: Path,
    plan: ChaosPlan,
    sent: list[str],
    clock: Clock,
    say: Say,
    *,
    flows: Sequence[str] = (),
) -> tuple[str | None, InFlight | None]:
    """Until nothing is in flight (``flows``: and every instance ended) for
    :data:`QUIET_POLLS` polls in a row; returns why it did not settle (None when it did)
    and the last view of what was in flight."""
    view = Progress(client.broker, records_dir, sent, flows)
    quiet, polls, deadline = 0, 0, time.monotonic() + plan.settle_timeout_s
    while True:
        await view.look()
        quiet = quiet + 1 if view.quiet else 0
        if quiet >= QUIET_POLLS:
            return None, view.in_flight
        if time.monotonic() > deadline:
            return f"not settled {plan.settle_timeout_s:g} s after the last publish", view.in_flight
        if view.stalled_s() > STALLED_S:
            return f"no progress for {STALLED_S:g} s", view.in_flight
        if polls % SAY_EVERY == 0:
            accounted = f"{view.accounted:,}/{len(sent):,} accounted"
            say(f"[{clock}] settling: {accounted}, in flight {view.in_flight}")
        polls += 1
        await asyncio.sleep(POLL_S)
