"""What one sequential invoke puts on the wire, message by message, grouped by subject.

    .venv/bin/python bench/wire.py [--rounds 200]

A tap (a nats-py subscriber on ``>``) counts every message the server routes while the
invokes run one at a time through a coordinator and a no-op agent, as in ``invoke.py``:
publishes, the deliveries of each consumer (a delivery carries the stored subject), acks,
API requests and their answers. ``messages.py`` counts the same traffic by connection;
this says which part of the path each message belongs to. A raw JetStream round trip
(publish, its ack, the pull request, the delivery, the ack) is 5 on this count.

The server sends an API advisory (``$JS.EVENT.ADVISORY.API``) for each JetStream API call
only while someone listens, so that line is the tap's own cost, not the product's.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections import Counter

import nats
from common import nats_server
from invoke import reach_stack

from agentreach.cli.logs import configure_logging

PREFIX = "wire"
WARM_UP = 20  # not counted: the first calls bind consumers and fill caches
_API = ("DIRECT.GET", "STREAM.INFO", "CONSUMER.MSG.NEXT", "STREAM.MSG.GET")


def kind_of(subject: str) -> str:
    """The group a subject is counted in: its stream or bucket, its kind of API call."""
    if subject.startswith("_INBOX."):
        return "_INBOX (publish acks, API answers)"
    if ack := re.match(r"\$JS\.ACK\.([^.]+)\.", subject):
        return f"$JS.ACK {ack.group(1)}"
    for call in _API:
        if subject.startswith(f"$JS.API.{call}."):
            return f"$JS.API.{call} {subject.removeprefix(f'$JS.API.{call}.').split('.')[0]}"
    if subject.startswith("$JS.EVENT.ADVISORY.API"):
        return "$JS.EVENT.ADVISORY.API (the tap's own)"
    if subject.startswith("$KV."):
        return f"$KV {subject.split('.')[1]}"
    return ".".join(subject.split(".")[:3])


async def count(rounds: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    async with nats_server() as url, reach_stack(url, PREFIX) as client:
        for _ in range(WARM_UP):
            await client.invoke("noop", {})
        tap = await nats.connect(url, name="wire-tap")

        async def noted(msg: nats.aio.msg.Msg) -> None:
            seen[kind_of(msg.subject)] += 1

        await tap.subscribe(">", cb=noted)
        await tap.flush()
        for _ in range(rounds):
            await client.invoke("noop", {})
        await asyncio.sleep(1.0)  # the last call's trailing work: its audit record
        await tap.drain()
    return seen


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    configure_logging("warning", "console")
    seen = await count(args.rounds)
    print(f"messages per sequential invoke, {args.rounds} invokes")
    for kind, n in seen.most_common():
        print(f"{n / args.rounds:7.2f}  {kind}")
    own = sum(n for kind, n in seen.items() if "the tap's own" not in kind)
    print(f"{own / args.rounds:7.2f}  in all, the tap's own left out (raw JetStream: 5)")


if __name__ == "__main__":
    asyncio.run(main())
