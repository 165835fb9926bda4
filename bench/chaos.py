"""Chaos at scale: 10,000+ tasks through repeated faults, then an account of every message id.

    .venv/bin/python bench/chaos.py [--tasks 10000] [--rate 120] [--rounds 3] [--flows N] [--keep]

On loopback: a nats-server with a store on a free port, coordinator replicas and three
recording agents, each a process of its own (`reach coordinator`, `reach agent
tests.chaos.recorder:agent_a`, …). While the tasks are published at a steady rate, each
round kills -9 an agent and restarts it with the same id (at once, or once the coordinator
has judged it OFFLINE and moved its queue), kills -9 a coordinator and restarts it, and
stops nats-server (every second round: kill -9) and starts it again on the same port and
store. Then it waits until nothing is in flight and prints the accounting table: sent,
completed once, run twice (on a
killed agent, or not), in the DLQ by reason, lost. The exit status is 1 when anything was
lost, ran twice without a kill, or a service failed. Beside the tasks it starts ``--flows``
two-step workflows (default one per 20 tasks), whose steps are tasks of the same agents:
every instance must end, and each step it sent run once as a task must. The harness is the
chaos suite's own (``tests/chaos/``); everything it starts is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.chaos

from agentreach.cli.logs import configure_logging
from tests.chaos.harness import ChaosPlan, run_chaos


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=120.0, help="tasks published per second")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three faults")
    parser.add_argument(
        "--restarts",
        default="at_once,when_offline",
        help="when a killed agent comes back, round after round: at_once, when_offline",
    )
    parser.add_argument("--coordinators", type=int, default=2)
    parser.add_argument(
        "--flows", type=int, default=None, help="two-step workflows beside (default: tasks/20)"
    )
    parser.add_argument("--work-ms", type=int, default=50, help="each execution's duration")
    parser.add_argument("--outage", type=float, default=6.0, help="seconds nats-server is down")
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep the store, records and logs")
    return parser.parse_args()


async def main() -> int:
    args = arguments()
    plan = ChaosPlan(
        tasks=args.tasks,
        rate=args.rate,
        rounds=args.rounds,
        restarts=tuple(args.restarts.split(",")),
        coordinators=args.coordinators,
        work_ms=args.work_ms,
        outage_s=args.outage,
        settle_timeout_s=args.settle_timeout,
        flows=args.tasks // 20 if args.flows is None else args.flows,
    )
    workdir = Path(tempfile.mkdtemp(prefix="reach-chaos-"))
    try:
        report = await run_chaos(plan, workdir, say=lambda line: print(line, flush=True))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(report.render())
    if args.keep:
        print(f"kept: {workdir}")
    return 1 if report.problems() else 0


if __name__ == "__main__":
    configure_logging("error")  # the publisher's reconnect warnings are part of the plan
    sys.exit(asyncio.run(main()))
