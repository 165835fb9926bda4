"""Agent-Reach against Celery + Redis at equal concurrency, measured in the same run.

    .venv/bin/python bench/celery_compare.py [--calls 500] [--tasks 2000] [--chains 300]

Needs ``redis-server`` on the PATH and ``celery`` and ``redis`` in the venv
(``apt-get install redis-server``; ``.venv/bin/pip install celery redis``); without them
it says so and exits 0. It starts its own redis-server on a free port and a Celery
worker (``--pool threads --concurrency 2``); the Agent-Reach agent has capacity 2.

- sequential calls: ``noop.delay().get()`` against ``ReachClient.invoke``, in alternating
  blocks of 50 so both see the same machine; p50 and p99;
- no-op tasks/s: ``--tasks`` sent at once, until every result is in;
- 3-step chains/s: ``chain(noop, noop, noop)`` against a 3-step workflow.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import celery_reach
from common import counting, nats_server, percentile
from e2e import publish_all

from agentreach.agents import ReachClient
from agentreach.broker import Broker, Names, Topology, provision
from agentreach.cli.logs import configure_logging
from agentreach.coordinator import Coordinator, CoordinatorConfig, IntakeConfig, QueueConfig
from agentreach.errors import ReachError

HERE = Path(__file__).resolve().parent
CONCURRENCY = celery_reach.CONCURRENCY
BLOCK = 50
WORKER_OPTIONS = (
    *("--pool", "threads", "--concurrency", str(CONCURRENCY), "--loglevel", "warning"),
    *("--without-gossip", "--without-mingle", "--without-heartbeat"),
)


def missing() -> str | None:
    """What is not installed, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not on the PATH (apt-get install redis-server)"
    for module in ("celery", "redis"):
        if importlib.util.find_spec(module) is None:
            return f"python package {module!r} is missing (.venv/bin/pip install celery redis)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def celery_worker() -> Iterator[object]:
    """A redis-server and a Celery worker of 2 threads; yields the ``noop`` task."""
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory(prefix="reach-celery-") as store:
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
            cwd=store,
            stdout=subprocess.DEVNULL,
        )
        env = {**os.environ, "BENCH_REDIS_URL": url}
        os.environ["BENCH_REDIS_URL"] = url
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", *WORKER_OPTIONS],
            cwd=HERE,
            env=env,
            stdout=subprocess.DEVNULL,  # the banner
        )
        try:
            sys.path.insert(0, str(HERE))
            import celery_app

            celery_app.app.conf.broker_url = celery_app.app.conf.result_backend = url
            noop = celery_app.noop
            noop.apply_async(({},)).get(timeout=60)  # the worker is up
            yield noop
        finally:
            for process in (worker, redis):
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)
                process.kill()


COORDINATOR_YAML = """\
intake: {batch: 128}
queues: {capacity: {P1: 8192}}
"""


@contextlib.asynccontextmanager
async def reach(url: str, prefix: str, *, apart: bool) -> AsyncIterator[tuple[Broker, ReachClient]]:
    """A coordinator serving a 3-step chain ``flow`` and one no-op agent of capacity 2: each
    in a process of its own (``apart``, as deployed), or both in this one."""
    names = Names(prefix=prefix)
    async with Broker(url, names=names, name=f"{prefix}-bench") as broker:
        await provision(broker, Topology.default(names))
        with contextlib.ExitStack() as processes:
            if apart:
                processes.enter_context(reach_processes(url, prefix))
            async with contextlib.AsyncExitStack() as stack:
                if not apart:
                    await stack.enter_async_context(in_process(broker, url, names))
                client = ReachClient(url, names=names, name=f"{prefix}-client")
                await stack.enter_async_context(client)
                await _ready(client)
                yield broker, client


@contextlib.asynccontextmanager
async def in_process(broker: Broker, url: str, names: Names) -> AsyncIterator[None]:
    config = CoordinatorConfig(
        intake=IntakeConfig(batch=128),
        queues=QueueConfig(capacity={"P1": 8192}),
        workflows=celery_reach.workflows,
    )
    agent = celery_reach.agent
    async with Coordinator(broker, config).running(), agent.running(url, names=names):
        yield


@contextlib.contextmanager
def reach_processes(url: str, prefix: str) -> Iterator[None]:
    """``reach coordinator`` and ``reach agent``, as an operator runs them."""
    reach_cli = str(Path(sys.executable).with_name("reach"))
    common = ("--nats-url", url, "--prefix", prefix, "--log-level", "warning")
    with tempfile.TemporaryDirectory(prefix="reach-celery-") as tmp:
        config = Path(tmp, "coordinator.yaml")
        config.write_text(COORDINATOR_YAML)
        coordinator = ("--config", str(config), "--metrics-port", "-1")
        workflows = ("--workflows", "celery_reach:workflows")
        commands = [
            [reach_cli, "coordinator", *common, *coordinator, *workflows],
            [reach_cli, "agent", *common, "celery_reach:agent"],
        ]
        started = [subprocess.Popen(command, cwd=HERE) for command in commands]
        try:
            yield
        finally:
            for process in started:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)
                process.kill()


async def _ready(client: ReachClient) -> None:
    """Once a call goes through: the agent has registered and the coordinator routes."""
    for _ in range(60):
        try:
            await client.invoke("noop", {}, execute_deadline_ms=2000)
            return
        except ReachError:
            await asyncio.sleep(0.5)
    raise SystemExit("the coordinator and agent did not answer within 30 s")


async def latency(noop: object, client: ReachClient, calls: int) -> tuple[list, list]:
    celery: list[float] = []
    ours: list[float] = []

    def celery_block() -> None:
        for _ in range(BLOCK):
            started = time.perf_counter()
            noop.apply_async(({},)).get(timeout=30)  # type: ignore[attr-defined]
            celery.append(time.perf_counter() - started)

    for _ in range(max(1, calls // BLOCK)):
        await asyncio.to_thread(celery_block)
        for _ in range(BLOCK):
            started = time.perf_counter()
            await client.invoke("noop", {})
            ours.append(time.perf_counter() - started)
    return celery, ours


def celery_rate(noop: object, count: int, chained: bool) -> float:
    from celery import chain

    started = time.perf_counter()
    if chained:
        results = [chain(noop.s(i), noop.s(), noop.s()).apply_async() for i in range(count)]  # type: ignore[attr-defined]
    else:
        results = [noop.apply_async((i,)) for i in range(count)]  # type: ignore[attr-defined]
    for result in results:
        result.get(timeout=300)
    return count / (time.perf_counter() - started)


async def reach_rate(broker: Broker, client: ReachClient, count: int, chained: bool) -> float:
    topic, ending = ("flow", "workflow_completed") if chained else ("noop", "completed")
    async with counting(broker, broker.names.events_of_kind(ending), count) as done:
        started = time.perf_counter()
        await publish_all(lambda i: client.publish(topic, {"n": i}), count, 256)
        await asyncio.wait_for(done.wait(), timeout=600)
        return count / (time.perf_counter() - started)


def _ms(samples: list[float], q: int) -> float:
    return percentile(samples, q) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--chains", type=int, default=300)
    parser.add_argument(
        "--together",
        action="store_true",
        help="the coordinator and the agent in this process (default: each in its own)",
    )
    args = parser.parse_args()
    if why := missing():
        print(f"skipped: {why}")
        return
    configure_logging("warning", "console")
    with celery_worker() as noop:
        async with (
            nats_server() as url,
            reach(url, "benchcel", apart=not args.together) as (broker, client),
        ):
            celery_lat, reach_lat = await latency(noop, client, args.calls)
            rates = {}
            for label, count, chained in (
                ("no-op tasks/s", args.tasks, False),
                ("3-step chains/s", args.chains, True),
            ):
                theirs = await asyncio.to_thread(celery_rate, noop, count, chained)
                ours = await reach_rate(broker, client, count, chained)
                rates[label] = (theirs, ours)
    shape = "in the bench's process" if args.together else "each in a process of its own"
    print(f"concurrency {CONCURRENCY} on both sides (Celery threads / agent capacity)")
    print(f"Celery's worker in a process of its own; Reach's coordinator and agent {shape}")
    print(f"{'measure':<26}{'celery+redis':>14}{'agent-reach':>14}{'reach/celery':>14}")
    for q in (50, 99):
        theirs, ours = _ms(celery_lat, q), _ms(reach_lat, q)
        line = f"{theirs:11.2f} ms{ours:11.2f} ms{theirs / ours:13.2f}x"
        print(f"{f'sequential call p{q}':<26}{line}   (x > 1: reach faster)")
    for label, (theirs, ours) in rates.items():
        print(f"{label:<26}{theirs:14.0f}{ours:14.0f}{ours / theirs:13.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
