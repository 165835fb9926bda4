"""Where one invoke's time goes: each stage of its path, seen on the wire.

    .venv/bin/python bench/stages.py [--rounds 60]

A tap (a nats-py subscriber on ``>`` in a process of its own) notes when the server hands
it each message; the invokes run one at a time, 50 ms apart, through a coordinator and a
no-op agent in this process, as in ``invoke.py``. For each invoke the first message of
each stage is found by its subject, and the table gives the median time from the call to
it, and from the stage before. The raw JetStream round trip (publish → pull → ack) of the
same server is measured in the same run, for scale. The tap sees a message a little after
the server routes it: its lag, the time a core message sent (and flushed) just before each
invoke takes to reach it, is printed too; it is part of every offset, not of the steps.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats
from common import nats_server, percentile
from invoke import jetstream_round_trip, reach_stack

from agentreach.broker import Names
from agentreach.cli.logs import configure_logging

PREFIX = "stages"
GAP_S = 0.05
MARK = "stages-mark"  # a core message sent just before each invoke: the tap's own lag


@dataclass(frozen=True)
class Stage:
    name: str
    matches: Callable[[str], bool]
    nth: int = 1  # the nth message of the invoke that matches


def stages(names: Names, agent_id: str) -> list[Stage]:
    executions = names.executions_bucket
    record = re.compile(rf"^\$KV\.{re.escape(executions)}\.")
    reply_box = f"{names.prefix}.reply."
    return [
        Stage("task published (intake)", lambda s: s.startswith(f"{names.prefix}.task.")),
        Stage(
            "run-once read (coordinator)",
            lambda s: s.startswith(f"$JS.API.DIRECT.GET.KV_{executions}"),
        ),
        Stage("routed event", lambda s: s.startswith(f"{names.prefix}.event.routed.")),
        Stage("dispatch", lambda s: s.startswith(names.dispatch(agent_id, "P1"))),
        Stage("claim written (agent)", lambda s: bool(record.match(s))),
        Stage("accepted event", lambda s: s.startswith(f"{names.prefix}.event.accepted.")),
        Stage("outcome recorded (agent)", lambda s: bool(record.match(s)), nth=2),
        Stage(
            "result reply",
            lambda s: s.startswith(reply_box) and s.endswith(f".{agent_id}"),
            nth=2,  # the first is the ack
        ),
        Stage("completed event", lambda s: s.startswith(f"{names.prefix}.event.completed.")),
    ]


async def tap(url: str) -> None:
    """Print ``<ns> <subject>`` of every message until stdin closes."""
    nc = await nats.connect(url)
    lines: list[str] = []

    async def noted(msg: object) -> None:
        lines.append(f"{time.time_ns()} {msg.subject}")  # type: ignore[attr-defined]

    await nc.subscribe(">", cb=noted)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await nc.drain()
    print("\n".join(lines), flush=True)


async def timed_invokes(
    url: str, rounds: int
) -> tuple[list[tuple[int, int]], list[int], list[str]]:
    """``(start ns, end ns)`` of each invoke, when each mark was sent, and the tap's lines."""
    async with reach_stack(url, PREFIX) as client:
        tapping = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--tap",
            url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert tapping.stdin is not None and tapping.stdout is not None
        await asyncio.wait_for(tapping.stdout.readline(), timeout=10)
        windows, marks = [], []
        for _ in range(rounds):
            await asyncio.sleep(GAP_S)  # the last one's trailing work (audit, metrics) is done
            marks.append(time.time_ns())
            await client.broker.nc.publish(MARK, b"")
            await client.broker.nc.flush()
            started = time.time_ns()
            await client.invoke("noop", {})
            windows.append((started, time.time_ns()))
        await asyncio.sleep(GAP_S)
        tapping.stdin.write(b"\n")
        await tapping.stdin.drain()
        output, _ = await asyncio.wait_for(tapping.communicate(), timeout=30)
    return windows, marks, output.decode().splitlines()


def offsets_ms(
    windows: list[tuple[int, int]], marks: list[int], lines: list[str], plan: list[Stage]
) -> tuple[dict[str, list[float]], list[float], list[float]]:
    """Each stage's offsets from its invoke's start, each invoke's whole time, and the
    tap's lag behind each mark."""
    seen = [(int(ns), subject) for ns, _, subject in (line.partition(" ") for line in lines)]
    found: dict[str, list[float]] = {stage.name: [] for stage in plan}
    for started, ended in windows:
        inside = [(ns, s) for ns, s in seen if started <= ns <= ended + 5_000_000]
        for stage in plan:
            hits = [ns for ns, s in inside if stage.matches(s)]
            if len(hits) >= stage.nth:
                found[stage.name].append((hits[stage.nth - 1] - started) / 1e6)
    lag = [(next(ns for ns, s in seen if s == MARK and ns >= sent) - sent) / 1e6 for sent in marks]
    return found, [(ended - started) / 1e6 for started, ended in windows], lag


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--tap", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tap:
        await tap(args.tap)
        return
    configure_logging("warning", "console")
    async with nats_server() as url:
        js = await jetstream_round_trip(url, args.rounds)
        windows, marks, lines = await timed_invokes(url, args.rounds)
    plan = stages(Names(prefix=PREFIX), f"{PREFIX}-agent")
    found, whole, lag = offsets_ms(windows, marks, lines, plan)
    print(f"rounds: {args.rounds}, one at a time, {GAP_S * 1000:.0f} ms apart; medians")
    print(f"raw JetStream publish → consume: p50 {percentile(js, 50) * 1000:.2f} ms")
    print(f"the tap's lag (a core message to it): p50 {statistics.median(lag):.2f} ms")
    header = ("stage, in the order seen", "from the call", "from the last", "seen")
    print(f"{header[0]:<30} {header[1]:>14} {header[2]:>14} {header[3]:>6}")
    medians = {name: statistics.median(found[name]) for name in found if found[name]}
    medians["invoke returned"] = statistics.median(whole)
    before = 0.0
    for name, at in sorted(medians.items(), key=lambda item: item[1]):
        seen = len(found.get(name, whole))
        print(f"{name:<30} {at:11.2f} ms {at - before:11.2f} ms {seen:>6}")
        before = at
    missing = [name for name in found if not found[name]]
    if missing:
        print(f"not seen: {', '.join(missing)}")


if __name__ == "__main__":
    asyncio.run(main())
