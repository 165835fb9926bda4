"""Messages through Python per no-op task and per 3-step chain, counted by the server.

    .venv/bin/python bench/messages.py [--tasks 2000] [--chains 300]

nats-server's ``connz`` counts the messages each connection sent and received. Over a run,
their sum per unit is what Agent-Reach costs in messages, since every publish, delivery, ack,
pull request and API call goes through a Python client at about the same price (~40 µs here).
The raw nats-py baseline (``e2e.py``'s publish → pull → ack) is counted the same way in the
same run, and costs 4. The tasks run as in ``e2e.py`` and the chains as in
``celery_compare.py``; both counts include the bench's own counting subscriptions (one or two
deliveries per unit). The server is started here, with its monitoring port, on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from celery_compare import reach, reach_rate
from e2e import baseline, reach_path

from agentreach.broker import EmbeddedServer
from agentreach.cli.logs import configure_logging

_MONITOR = re.compile(r"Starting http monitor on (?P<address>\S+)")
ROLES = ("client", "coordinator", "agent")


@asynccontextmanager
async def monitored_server() -> AsyncIterator[tuple[str, str]]:
    """A nats-server on free loopback ports: (client URL, monitoring URL)."""
    monitor: list[str] = []

    def watch(line: str) -> None:
        if match := _MONITOR.search(line):
            monitor.append(match.group("address"))

    with tempfile.TemporaryDirectory(prefix="reach-bench-") as store:
        config = Path(store) / "server.conf"
        config.write_text(
            'listen: "127.0.0.1:-1"\nhttp: "127.0.0.1:-1"\n'
            f"jetstream {{ store_dir: {json.dumps(store)} }}\n"
        )
        async with EmbeddedServer(config=config, store_dir=store, on_log=watch) as server:
            yield server.url, f"http://{monitor[0]}"


def _counts(monitor: str) -> dict[int, tuple[str, int]]:
    """Each connection's (name, messages sent + received), closed ones too."""
    with urllib.request.urlopen(f"{monitor}/connz?limit=4096&state=all", timeout=10) as answer:
        connections = json.load(answer)["connections"]
    return {c["cid"]: (c.get("name", ""), c["in_msgs"] + c["out_msgs"]) for c in connections}


def _role(name: str) -> str:
    return next((role for role in ROLES if role in name), "other")


async def _settled(
    monitor: str, *, every_s: float = 0.2, at_most_s: float = 10.0
) -> dict[int, tuple[str, int]]:
    """The counts once they stop moving: the last acks and audit records land after a run."""
    counts = await asyncio.to_thread(_counts, monitor)
    for _ in range(int(at_most_s / every_s)):
        await asyncio.sleep(every_s)
        again = await asyncio.to_thread(_counts, monitor)
        if again == counts:
            break
        counts = again
    return counts


async def per_unit(monitor: str, units: int, run: Callable[[], Awaitable[object]]) -> Counter[str]:
    """Messages per unit of ``run`` through each role's connections (and ``total``)."""
    before = await asyncio.to_thread(_counts, monitor)
    await run()
    after = await _settled(monitor)
    spent: Counter[str] = Counter()
    for cid, (name, count) in after.items():
        moved = count - before.get(cid, (name, 0))[1]
        spent[_role(name)] += moved
        spent["total"] += moved
    return Counter({role: round(n / units, 1) for role, n in spent.items()})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--chains", type=int, default=300)
    args = parser.parse_args()
    configure_logging("warning", "console")
    rows: dict[str, Counter[str]] = {}
    async with monitored_server() as (url, monitor):
        rows["raw nats-py message"] = await per_unit(
            monitor, args.tasks, lambda: baseline(url, args.tasks, 256)
        )
        rows["no-op task"] = await per_unit(
            monitor, args.tasks, lambda: reach_path(url, args.tasks, 256)
        )
        async with reach(url, "benchmsg", apart=False) as (broker, client):
            rows["3-step chain"] = await per_unit(
                monitor, args.chains, lambda: reach_rate(broker, client, args.chains, True)
            )
    raw = rows["raw nats-py message"]["total"]
    print("messages through Python per unit (sent + received, every connection)")
    print(f"{'unit':<22}{'total':>8}{'client':>9}{'coord.':>9}{'agent':>9}{'x raw':>9}")
    for unit, spent in rows.items():
        parts = "".join(f"{spent[role]:9.1f}" if spent[role] else f"{'':9}" for role in ROLES)
        print(f"{unit:<22}{spent['total']:8.1f}{parts}{spent['total'] / raw:9.1f}")


if __name__ == "__main__":
    asyncio.run(main())
