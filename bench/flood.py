"""One caller's flood against another caller's invokes, through one coordinator.

    .venv/bin/python bench/flood.py [--flood 20000] [--rounds 60] [--quota-rate 50]

Caller ``flooder`` publishes ``--flood`` tasks on ``reach.task.flood.flooder`` as fast as its
connection takes them (pipelined, 500 in flight), while caller ``bob`` makes ``--rounds``
sequential ``ReachClient.invoke`` calls of a no-op agent on another topic. Measured in the same
run, each scenario on a fresh prefix of one embedded server (loopback only):

- baseline: bob's invokes with no flood;
- flood: bob's invokes while the flood drains, without the intake's per-subject bound (as
  before it) and with it (``limits.tasks_per_subject``, ``--per-subject``), each without
  and with a quota (``rate_limits.callers.flooder`` at ``--quota-rate``/s).

Printed per scenario: bob's p50/p99 and their ratio to the baseline, the flood's publish rate,
and its drain rate (intake messages acknowledged per second, until the intake is empty or
``--drain-s`` is up). Every wait is bounded; the run stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator

from common import nats_server, percentile

from agentreach import ReachError, envelopes
from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import Broker, Names, provision
from agentreach.broker.limits import DEFAULT_TASKS_PER_SUBJECT, StorageLimits
from agentreach.broker.pipelined import Outgoing
from agentreach.broker.streams import consumer_backlog
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, RateLimits
from agentreach.envelopes import RateLimit
from agentreach.envelopes import headers as h

IN_FLIGHT = 500  # flood publishes awaiting their acks at once
INVOKE_TIMEOUT_S = 30.0


def agent_for(topic: str, work_s: float = 0.0) -> Agent:
    """An agent of its own for each topic (bob's and the flood's), a handler each that
    returns after ``work_s``: what is measured is the way through intake, not one agent's
    queue."""
    agent = Agent(f"bench-{topic}", startup_delay=0)

    @agent.handler(topic, capacity=1000 if not work_s else 4)
    async def noop(ctx: TaskContext, payload: object) -> object:
        if work_s:
            await asyncio.sleep(work_s)
        return payload

    return agent


async def flood(client: ReachClient, n: int) -> tuple[float, int]:
    """Publish ``n`` tasks as ``client``'s caller: (seconds it took, publishes refused)."""
    broker, started, refused = client.broker, time.perf_counter(), Counter[str]()
    for start in range(0, n, IN_FLIGHT):
        batch = []
        for i in range(start, min(n, start + IN_FLIGHT)):
            task = client.task("flood", {"i": i}, ttl_ms=600_000)
            subject = broker.names.task(task.topic, client.caller)
            batch.append(Outgoing(subject, envelopes.encode(task), h.task_headers(task)))
        for failed in await broker.publish_all(batch, timeout=30):
            if failed is not None:
                refused[str(failed)] += 1
    for why, count in refused.items():
        print(f"  flood publishes refused: {count} ({why})")
    return time.perf_counter() - started, sum(refused.values())


async def bob_invokes(client: ReachClient, rounds: int) -> list[float]:
    """Bob's sequential invokes, each timed; a failed one (not acknowledged within its 2 s
    deadline, refused) is said once per kind and counted in at its time."""
    samples, failures = [], Counter[str]()
    for _ in range(rounds):
        started = time.perf_counter()
        try:
            await asyncio.wait_for(client.invoke("echo", {}), INVOKE_TIMEOUT_S)
        except (ReachError, TimeoutError) as exc:
            failures[type(exc).__name__] += 1
        samples.append(time.perf_counter() - started)
    if failures:
        print(f"  bob's failed invokes: {dict(failures)} of {rounds}")
    return samples


async def drained(broker: Broker, n: int, started: float, deadline_s: float) -> tuple[int, float]:
    """Wait until the intake holds nothing (or ``deadline_s`` after ``started``): (tasks
    taken, seconds since ``started``)."""
    names, left = broker.names, n
    while time.perf_counter() - started < deadline_s:
        left = await consumer_backlog(broker, names.tasks_stream, names.coordinator_intake) or 0
        if left == 0:
            break
        await asyncio.sleep(0.2)
    return n - left, time.perf_counter() - started


@contextlib.asynccontextmanager
async def deployment(
    url: str, prefix: str, config: CoordinatorConfig, flood_work_s: float = 0.0
) -> AsyncIterator[tuple[Broker, ReachClient, ReachClient]]:
    names = Names(prefix=prefix)
    async with Broker(url, names=names, name="bench-coordinator") as broker:
        await provision(broker, config.topology(names))
        async with (
            Coordinator(broker, config).running(),
            agent_for("echo").running(url, names=names),
            agent_for("flood", flood_work_s).running(url, names=names),
            ReachClient(url, names=names, name="bob") as bob,
            ReachClient(url, names=names, name="flooder") as flooder,
        ):
            await bob.invoke("echo", {})  # warm-up: consumers bound, caches filled
            await flooder.invoke("flood", {})
            yield broker, bob, flooder


def line(label: str, samples: list[float], base: tuple[float, float] | None) -> str:
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    text = f"{label:<22} bob p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
    if base is not None:
        text += f"  (x{p50 / base[0]:.1f} / x{p99 / base[1]:.1f} of baseline)"
    return text


async def scenario(url: str, prefix: str, config: CoordinatorConfig, args) -> list[float]:  # type: ignore[no-untyped-def]
    work_s = args.flood_agent_ms / 1000
    async with deployment(url, prefix, config, work_s) as (broker, bob, flooder):
        if not args.flood:
            return await bob_invokes(bob, args.rounds)
        started = time.perf_counter()
        flooding = asyncio.create_task(flood(flooder, args.flood))
        await asyncio.sleep(0.5)  # the flood is under way: a backlog stands before bob
        try:
            samples = await bob_invokes(bob, args.rounds)
        finally:
            publish_s, refused = await flooding
        taken, drain_s = await drained(broker, args.flood - refused, started, args.drain_s)
        print(
            f"  flood: {args.flood} published in {publish_s:.1f} s "
            f"({args.flood / publish_s:,.0f}/s); intake took {taken} in "
            f"{drain_s:.1f} s ({taken / drain_s:,.0f}/s)"
        )
        return samples


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flood", type=int, default=20_000, help="tasks the flooder sends")
    parser.add_argument("--rounds", type=int, default=60, help="bob's invokes per scenario")
    parser.add_argument("--quota-rate", type=float, default=50.0, help="flooder's quota, /s")
    parser.add_argument("--drain-s", type=float, default=120.0, help="longest wait to drain")
    parser.add_argument(
        "--per-subject", type=int, default=DEFAULT_TASKS_PER_SUBJECT, help="intake bound"
    )
    parser.add_argument(
        "--flood-agent-ms",
        type=float,
        default=0.0,
        help="the flood agent's time per task"
        " (0: a no-op; else it runs 4 at once, and the flood waits for room in intake)",
    )
    parser.add_argument("--only", default="", help="run the scenarios whose label has this")
    args = parser.parse_args()
    configure_logging("warning", "console")
    quota = RateLimit(rate=args.quota_rate, burst=int(args.quota_rate * 2))
    quotas = RateLimits(callers={"flooder": quota})
    unbound = StorageLimits(tasks_per_subject=-1)  # as before the bound
    bound = StorageLimits(tasks_per_subject=args.per_subject)
    scenarios = [
        ("flood, no bound", CoordinatorConfig(limits=unbound)),
        ("flood, no bound, quota", CoordinatorConfig(limits=unbound, rate_limits=quotas)),
        (f"flood, bound {args.per_subject}", CoordinatorConfig(limits=bound)),
        ("flood, bound, quota", CoordinatorConfig(limits=bound, rate_limits=quotas)),
    ]
    print(
        f"flood {args.flood} tasks, bob {args.rounds} sequential invokes per scenario; "
        f"quota {args.quota_rate:g}/s"
    )
    async with nats_server() as url:
        base_args = argparse.Namespace(**{**vars(args), "flood": 0})
        base = await scenario(url, "fbase", CoordinatorConfig(), base_args)
        reference = (percentile(base, 50) * 1000, percentile(base, 99) * 1000)
        print(line("baseline (no flood)", base, None))
        for i, (label, config) in enumerate(scenarios):
            if args.only and args.only not in label:
                continue
            print(line(label, await scenario(url, f"flood{i}", config, args), reference))


if __name__ == "__main__":
    asyncio.run(main())
