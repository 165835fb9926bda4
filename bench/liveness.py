"""Liveness at scale: N simulated agents heartbeating against one coordinator.

    .venv/bin/python bench/liveness.py [--agents 10000] [--interval 15] [--duration 60] [--kill 20]
                                       [--busy 0.0]

The coordinator runs in a process of its own, so its CPU and memory are its own: the bench
reads them from /proc. Every simulated agent writes its heartbeat into reach_heartbeats
every interval ±20 % from this process (core publishes to the bucket's subject, flushed
per batch: the simulator must not be the bottleneck). Counts false SUSPECTs and OFFLINEs (an
agent still beating judged so), then stops --kill agents halfway and reports how long the
coordinator took to mark them SUSPECT and OFFLINE, against the silence thresholds (3 and 5
intervals after the last beat). Prints the coordinator's share of one core over the second
half of the run (every agent known by then) and its RSS.

The simulated agents have no presence subscription: the coordinator's presence checks get
"no responders" from every one, which counts only against an agent whose heartbeat is late
(none of them answered a check). A killed agent is found that way, once its heartbeat is
late. --busy makes that share of the agents report a task in flight, so that they are checked
between heartbeats too (bounded per tick): the cost of the checks at scale.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import os
import random
import sys
import time

from common import nats_server, percentile

from agentreach import envelopes
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, LivenessConfig
from agentreach.envelopes import Heartbeat

PREFIX = "benchlive"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--kill", type=int, default=20)
    parser.add_argument("--busy", type=float, default=0.0, help="share with a task in flight")
    parser.add_argument("--coordinator-at", help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args()
    configure_logging("warning", "console")
    if args.coordinator_at:
        await serve_coordinator(args.coordinator_at, args.interval)
        return
    names = Names(prefix=PREFIX)
    ids = [f"sim-{i:06d}" for i in range(args.agents)]
    killed = set(random.Random(1).sample(ids, args.kill))
    busy = set(random.Random(3).sample(ids, int(args.busy * len(ids))))
    state: dict[str, list[tuple[str, float, str]]] = {}
    last_beat: dict[str, float] = {}
    online: set[str] = set()
    async with nats_server() as url, Broker(url, names=names, name="bench-live") as broker:
        await provision(broker, Topology.default(names))

        async def on_state(msg) -> None:  # type: ignore[no-untyped-def]
            event = envelopes.decode_event(msg.data)
            state.setdefault(event.agent_id or "", []).append(
                (event.detail["state"], time.monotonic(), event.detail["reason"])
            )
            if event.detail["state"] == "ONLINE":
                online.add(event.agent_id or "")

        await broker.nc.subscribe(names.events_of_kind("agent_state"), cb=on_state)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--coordinator-at",
            url,
            "--interval",
            str(args.interval),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            await asyncio.wait_for(child.stdout.readline(), 60)  # "ready"
            usage = Usage(child.pid)
            started = time.monotonic()
            beats = await beat(broker, ids, killed, busy, last_beat, args, started, usage, online)
            ended = time.monotonic()
            usage.mark("end")
            # Heartbeats have stopped: judgements from here on are not false alarms.
            await asyncio.sleep(2 * args.interval)  # the late killed ones are judged meanwhile
        finally:
            assert child.stdin is not None
            child.stdin.close()
            await asyncio.wait_for(child.wait(), 30)
    report(args, ids, killed, state, last_beat, beats, ended, usage)


async def serve_coordinator(url: str, interval: float) -> None:
    config = CoordinatorConfig(
        prefix=PREFIX,
        liveness=LivenessConfig(
            tick_s=min(1.0, interval / 10), probe_connection_s=1.0, probe_ping_s=1.0
        ),
    )
    names = Names(prefix=PREFIX)
    async with (
        Broker(url, names=names, name="bench-coordinator") as own,
        Coordinator(own, config).running(),
    ):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
    # A task the coordinator left behind keeps asyncio.run from returning: name it.
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        print(f"left running after the coordinator stopped: {task!r}", file=sys.stderr)
        task.print_stack(file=sys.stderr)


class Usage:
    """CPU seconds and RSS of one process, read from /proc at marks."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.marks: dict[str, tuple[float, float, int]] = {}
        self.mark("start")

    def mark(self, name: str) -> None:
        with open(f"/proc/{self._pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
        with open(f"/proc/{self._pid}/status") as status:
            rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        self.marks[name] = (time.monotonic(), cpu_s, rss_kb)

    def share(self, since: str, until: str) -> float:
        (t0, c0, _), (t1, c1, _) = self.marks[since], self.marks[until]
        return (c1 - c0) / (t1 - t0)


async def beat(broker, ids, killed, busy, last_beat, args, started, usage, online) -> int:  # type: ignore[no-untyped-def]
    subject = f"$KV.{broker.names.heartbeats_bucket}."
    nc = broker.nc
    rng = random.Random(2)
    due = [(started + rng.uniform(0, args.interval), agent_id) for agent_id in ids]
    heapq.heapify(due)
    kill_at, sent, end = started + args.duration / 2, 0, started + args.duration
    while due and due[0][0] < end:
        now = time.monotonic()
        if len(online) == len(ids) and "online" not in usage.marks:
            usage.mark("online")  # every agent is known and judged: the steady state
        if now >= kill_at and "half" not in usage.marks:
            usage.mark("half")
        batch = []
        while due and due[0][0] <= now:
            _, agent_id = heapq.heappop(due)
            if agent_id in killed and now >= kill_at:
                continue  # this one died: no more heartbeats
            batch.append(agent_id)
            heapq.heappush(due, (now + args.interval * rng.uniform(0.8, 1.2), agent_id))
        for agent_id in batch:
            in_flight = int(agent_id in busy)
            beat = Heartbeat(
                agent_id=agent_id, epoch=1, seq=0, interval_s=args.interval, in_flight=in_flight
            )
            await nc.publish(subject + agent_id, envelopes.encode(beat))
            last_beat[agent_id] = time.monotonic()
        if batch:
            await nc.flush(timeout=10)
            sent += len(batch)
        await asyncio.sleep(max(0.0, min(0.02, due[0][0] - time.monotonic())) if due else 0)
    return sent


def report(args, ids, killed, state, last_beat, beats, ended, usage) -> None:  # type: ignore[no-untyped-def]
    def judged_falsely(judgement: str) -> list[str]:
        return [
            a
            for a in ids
            if a not in killed and any(s == judgement and t < ended for s, t, _ in state.get(a, []))
        ]

    suspect_lat, offline_lat, reasons = [], [], set()
    for agent_id in killed:
        marks = {s: t for s, t, _ in reversed(state.get(agent_id, []))}
        reasons |= {f"{s} {why!r}" for s, _, why in state.get(agent_id, []) if s != "ONLINE"}
        if "SUSPECT" in marks:
            suspect_lat.append(marks["SUSPECT"] - last_beat[agent_id])
        if "OFFLINE" in marks:
            offline_lat.append(marks["OFFLINE"] - last_beat[agent_id])
    print(
        f"agents: {args.agents} ({args.busy:.0%} with a task in flight),"
        f" interval {args.interval:g}s ±20 %, run {args.duration:g}s"
    )
    print(f"heartbeats written: {beats} ({beats / args.duration:.0f}/s)")
    print(f"false SUSPECT among live agents: {len(judged_falsely('SUSPECT'))}")
    print(f"false OFFLINE among live agents: {len(judged_falsely('OFFLINE'))}")
    print(f"the killed agents were judged: {', '.join(sorted(reasons)) or 'not at all'}")
    for name, lat, limit in (("SUSPECT", suspect_lat, 3), ("OFFLINE", offline_lat, 5)):
        if not lat:
            print(f"{name}: none detected of {len(killed)} killed")
            continue
        print(
            f"{name} detected {len(lat)}/{len(killed)} after last beat: "
            f"min {min(lat):.2f}s p50 {percentile(lat, 50):.2f}s max {max(lat):.2f}s "
            f"(threshold {limit * args.interval:g}s, +10 % = {limit * args.interval * 1.1:.1f}s)"
        )
    marks = usage.marks
    if "online" in marks and marks["online"][0] < marks["half"][0]:
        arrival = marks["online"][0] - marks["start"][0]
        print(
            f"coordinator CPU, share of one core: {usage.share('start', 'online'):.0%} while"
            f" the agents arrived ({arrival:.0f} s), {usage.share('online', 'half'):.0%} in"
            f" the steady state (every agent ONLINE, until the kill)"
        )
    else:
        print(
            f"coordinator CPU, share of one core: {usage.share('start', 'half'):.0%} until the"
            " kill: NOT every agent was ONLINE by then (no steady state; run longer)"
        )
    print(f"coordinator CPU after the kill: {usage.share('half', 'end'):.0%}")
    rss = {name: mark[2] / 1024 for name, mark in marks.items()}
    print(
        f"coordinator RSS: at start {rss['start']:.0f} MiB, every agent known"
        f" {rss.get('online', float('nan')):.0f} MiB, at the kill {rss['half']:.0f} MiB,"
        f" end {rss['end']:.0f} MiB"
    )


if __name__ == "__main__":
    asyncio.run(main())
