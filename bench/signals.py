"""A flood of signals to one workflow instance: how fast the coordinator judges them.

    .venv/bin/python bench/signals.py [--signals 3000] [--rounds 2]

One state machine instance waits in a state that takes no event; ``--signals`` signals are
published to it (pipelined, 500 at a time) and each is judged and ignored, one at a time in
the order stored, by one coordinator and then by two replicas sharing the consumer. The
time runs from the first publish until the instance's record says the last one was judged.
The baseline, in the same run on the same server, is raw nats-py publish → pull → ack of
as many messages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Callable

from common import nats_server
from e2e import baseline

from agentreach.agents import ReachClient
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import read_record
from agentreach.envelopes import WorkflowRecord
from agentreach.envelopes import headers as h

WAITING = wf.machine(
    "a", {"a": wf.state(next=[wf.go("done", event="stop")]), "done": wf.state(terminal=True)}
)


async def flood(url: str, signals: int, replicas: int, label: str) -> float:
    """Seconds until ``signals`` signals to one instance are judged by ``replicas``."""
    names = Names(prefix=f"benchsig{label}")
    config = CoordinatorConfig(workflows={"waiting": WAITING})
    async with contextlib.AsyncExitStack() as stack:
        broker = await stack.enter_async_context(Broker(url, names=names, name="bench"))
        await provision(broker, Topology.default(names))
        for _ in range(replicas):
            own = await stack.enter_async_context(Broker(url, names=names, name="coordinator"))
            await stack.enter_async_context(Coordinator(own, config).running())
        client = await stack.enter_async_context(ReachClient(url, names=names, name="bench"))
        instance, _ = await client.publish("waiting", {}, ttl_ms=3_600_000)
        await _until(broker, instance, lambda record: record.current == "a")
        subject = f"{names.workflow_signal(instance, 'nope')}.{client.caller}"
        started, last = time.perf_counter(), 0
        for sent in range(0, signals, 500):
            acks = await asyncio.gather(
                *(
                    broker.publish(subject, b"", headers=h.control_headers("signal"))
                    for _ in range(min(500, signals - sent))
                )
            )
            last = max(last, *(ack.seq for ack in acks))
        await _until(broker, instance, lambda record: record.last_signal_seq >= last)
        return time.perf_counter() - started


async def _until(broker: Broker, instance: str, wanted: Callable[[WorkflowRecord], bool]) -> None:
    while True:  # the record's write is the coordinator's: no event says when
        if (record := await read_record(broker, instance)) is not None and wanted(record):
            return
        await asyncio.sleep(0.01)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    configure_logging("error", "console")
    async with nats_server() as url:
        raw = await baseline(url, args.signals, 500)
        print(f"signals: {args.signals} to one instance, each ignored")
        print(f"raw nats-py publish → pull → ack : {args.signals / raw.elapsed:8.0f} /s")
        for n in range(args.rounds):
            for replicas in (1, 2):
                took = await flood(url, args.signals, replicas, f"{n}r{replicas}")
                rate = args.signals / took
                print(
                    f"round {n + 1}, {replicas} replica(s): {rate:8.0f} signals/s"
                    f" ({rate * raw.elapsed / args.signals * 100:5.1f} % of raw)"
                )


if __name__ == "__main__":
    asyncio.run(main())
