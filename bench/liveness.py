"""Liveness at scale: N simulated agents heartbeating against one coordinator.

    .venv/bin/python bench/liveness.py [--agents 10000] [--interval 15] [--duration 60] [--kill 20]

Every simulated agent writes its heartbeat to reach_heartbeats every interval ±20 %
from one process. Counts false SUSPECTs (an agent still beating judged SUSPECT), then
stops --kill agents halfway and reports how long the coordinator took to mark them
SUSPECT and OFFLINE, against the thresholds (3 and 5 intervals after the last beat).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import time

from common import nats_server, percentile

from agentreach import envelopes
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, LivenessConfig
from agentreach.envelopes import Heartbeat


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--kill", type=int, default=20)
    args = parser.parse_args()
    configure_logging("warning", "console")
    names = Names(prefix="benchlive")
    ids = [f"sim-{i:05d}" for i in range(args.agents)]
    killed = set(random.Random(1).sample(ids, args.kill))
    state: dict[str, list[tuple[str, float]]] = {}
    last_beat: dict[str, float] = {}
    async with nats_server() as url, Broker(url, names=names, name="bench-live") as broker:
        await provision(broker, Topology.default(names))

        async def on_state(msg) -> None:  # type: ignore[no-untyped-def]
            event = envelopes.decode_event(msg.data)
            state.setdefault(event.agent_id or "", []).append(
                (event.detail["state"], time.monotonic())
            )

        await broker.nc.subscribe(names.events_of_kind("agent_state"), cb=on_state)
        config = CoordinatorConfig(
            liveness=LivenessConfig(
                tick_s=min(1.0, args.interval / 10), probe_connection_s=1.0, probe_ping_s=1.0
            )
        )
        async with (
            Broker(url, names=names, name="bench-coordinator") as own,
            Coordinator(own, config).running(),
        ):
            started = time.monotonic()
            beats = await beat(broker, ids, killed, last_beat, args, started)
            ended = time.monotonic()
            # Heartbeats have stopped: judgements from here on are not false alarms.
            await asyncio.sleep(2 * args.interval)  # the late killed ones are judged meanwhile
    report(args, ids, killed, state, last_beat, beats, ended)


async def beat(broker, ids, killed, last_beat, args, started) -> int:  # type: ignore[no-untyped-def]
    kv = await broker.kv(broker.names.heartbeats_bucket)
    rng = random.Random(2)
    due = [(started + rng.uniform(0, args.interval), agent_id) for agent_id in ids]
    heapq.heapify(due)
    kill_at, sent, end = started + args.duration / 2, 0, started + args.duration
    while due and due[0][0] < end:
        now = time.monotonic()
        batch = []
        while due and due[0][0] <= now:
            _, agent_id = heapq.heappop(due)
            if agent_id in killed and now >= kill_at:
                continue  # this one died: no more heartbeats
            batch.append(agent_id)
            heapq.heappush(due, (now + args.interval * rng.uniform(0.8, 1.2), agent_id))
        if batch:
            await asyncio.gather(*(_put(kv, a, args.interval, last_beat) for a in batch))
            sent += len(batch)
        await asyncio.sleep(max(0.0, min(0.05, due[0][0] - time.monotonic())) if due else 0)
    return sent


async def _put(kv, agent_id: str, interval: float, last_beat: dict[str, float]) -> None:  # type: ignore[no-untyped-def]
    beat = Heartbeat(agent_id=agent_id, epoch=1, seq=0, interval_s=interval)
    await kv.put(agent_id, envelopes.encode(beat))
    last_beat[agent_id] = time.monotonic()


def report(args, ids, killed, state, last_beat, beats, ended) -> None:  # type: ignore[no-untyped-def]
    false_suspects = [
        a
        for a in ids
        if a not in killed and any(s == "SUSPECT" and t < ended for s, t in state.get(a, []))
    ]
    suspect_lat, offline_lat = [], []
    for agent_id in killed:
        marks = dict(reversed(state.get(agent_id, [])))
        if "SUSPECT" in marks:
            suspect_lat.append(marks["SUSPECT"] - last_beat[agent_id])
        if "OFFLINE" in marks:
            offline_lat.append(marks["OFFLINE"] - last_beat[agent_id])
    print(f"agents: {args.agents}, interval {args.interval:g}s ±20 %, run {args.duration:g}s")
    print(f"heartbeats written: {beats} ({beats / args.duration:.0f}/s)")
    print(f"false SUSPECT among live agents: {len(false_suspects)}")
    for name, lat, limit in (("SUSPECT", suspect_lat, 3), ("OFFLINE", offline_lat, 5)):
        if not lat:
            print(f"{name}: none detected of {len(killed)} killed")
            continue
        print(
            f"{name} detected {len(lat)}/{len(killed)} after last beat: "
            f"min {min(lat):.2f}s p50 {percentile(lat, 50):.2f}s max {max(lat):.2f}s "
            f"(threshold {limit * args.interval:g}s, +10 % = {limit * args.interval * 1.1:.1f}s)"
        )


if __name__ == "__main__":
    asyncio.run(main())
