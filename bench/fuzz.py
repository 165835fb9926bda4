"""Fuzz a real coordinator with 100,000+ generated intake messages, then account for each.

    .venv/bin/python bench/fuzz.py [--messages 100000] [--seed N] [--window 500] [--keep]

On loopback: a nats-server with a store on a free port, one `reach coordinator` process
(its RSS read from /proc/<pid>/status every second) and the fuzz agent, which serves the
topic `fuzz`, in this process. The messages come from the suite's hypothesis strategies
(tests/fuzz/): the suite's explicit cases first, then chunks of 1,000 drawn with the seeds
N, N+1, … in worker processes (one body near the 1 MiB limit per chunk), each case followed
by --variants copies of its body under the headers of other cases of its chunk; `--seed N`
repeats a run. Publishing goes on until --messages are stored in REACH_TASKS (JetStream
drops a repeated Nats-Msg-Id), with at most --window messages of the last --stuck-after
seconds in flight, and stops early when nothing has settled for --stall-timeout seconds;
the suite's trap cases (headers NATS clients read as their own) go last. A coordinator that
exits, or stops answering on `reach.ctl.routes.reload`, counts as a crash and is restarted.
At the end the run waits until every message is settled or nothing has moved for
--settle-timeout seconds, then prints: crashes, messages left unsettled (and REACH_TASKS'
backlog), bad inputs dead-lettered with a reason naming the JSON path or header (%), good
inputs routed, RSS at start / end / peak, and each kind of failure with examples.
Everything it starts is stopped; the exit status is 1 when a promise of issue 11 is broken.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import json
import multiprocessing
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.fuzz

import nats.errors

from agentreach.broker import Broker, EmbeddedServer
from agentreach.cli.logs import configure_logging
from agentreach.envelopes import headers as h
from agentreach.envelopes import is_token
from tests.fuzz.contract import Case
from tests.fuzz.harness import Ledger, drained
from tests.fuzz.strategies import (
    big_cases,
    cases,
    draw_cases,
    explicit_cases,
    trap_cases,
    wire_topics,
)

CHUNK = 1_000
REACH = Path(sys.executable).parent / "reach"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="stored in REACH_TASKS")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--window", type=int, default=500, help="messages in flight")
    parser.add_argument("--stuck-after", type=float, default=30.0, help="seconds")
    parser.add_argument("--settle-timeout", type=float, default=60.0, help="seconds")
    parser.add_argument("--generators", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--variants", type=int, default=3, help="per drawn case: its body with other headers"
    )
    parser.add_argument("--stall-timeout", type=float, default=120.0, help="seconds")
    parser.add_argument("--rss-growth-mb", type=float, default=100.0, help="allowed growth")
    parser.add_argument(
        "--without-header",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out generated messages with this header, to measure past a known defect",
    )
    parser.add_argument("--keep", action="store_true", help="keep the store and the log")
    return parser.parse_args()


def generate_chunk(seed: int, chunk: int) -> list[Case]:
    """Chunk ``chunk`` of the run with ``seed``: the same cases for the same pair."""
    drawn = draw_cases(
        cases(topics=wire_topics(), on_wire=True, big=False), CHUNK - 1, seed + chunk
    )
    return drawn + draw_cases(big_cases(on_wire=True), 1, seed + chunk)


async def chunks(seed: int, workers: int, variants: int):  # type: ignore[no-untyped-def]
    """The run's cases, in order, without end: the explicit ones, then chunks drawn ahead
    in ``workers`` processes, each case followed by ``variants`` of its body with the
    headers of other cases of its chunk (hypothesis draws are the costly part)."""
    for case in explicit_cases(on_wire=True):
        yield case
    loop = asyncio.get_running_loop()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        ahead = deque(loop.run_in_executor(pool, generate_chunk, seed, k) for k in range(workers))
        for k in itertools.count():
            drawn = await ahead.popleft()
            ahead.append(loop.run_in_executor(pool, generate_chunk, seed, k + workers))
            pick = random.Random(seed + k)
            for case in drawn:
                yield case
                for n in range(variants):
                    headers = dict(pick.choice(drawn).headers)
                    if is_token(headers.get(h.MSG_ID)):  # a new one, or JetStream drops it
                        headers[h.MSG_ID] = f"variant-{seed}-{k}-{n}-{pick.getrandbits(64):x}"
                    yield case.with_headers(headers, f"{case.note}; headers of another")


@dataclass
class Coordinator:
    """A `reach coordinator` process; its JSON log goes to a file and is tallied."""

    url: str
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    events: Counter[str] = field(default_factory=Counter)
    _reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.ready = asyncio.Event()
        self.process = await asyncio.create_subprocess_exec(
            str(REACH),
            "coordinator",
            "--nats-url",
            self.url,
            "--log-format",
            "json",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read(self.process))
        async with asyncio.timeout(30):
            await self.ready.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def stop(self) -> None:
        process = self.process
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        with self.log_path.open("ab") as log:
            while line := await process.stderr.readline():
                log.write(line)
                try:
                    record = json.loads(line)
                except ValueError:  # the CLI's own lines; a traceback would be one too
                    text = line.decode(errors="replace")
                    if "Error" in text or "Traceback" in text:
                        self.events["output: " + text[:80].strip()] += 1
                    continue
                event = str(record.get("event", ""))
                if event == "coordinator serving":
                    self.ready.set()
                if record.get("level") in ("warning", "error", "critical"):
                    self.events[f"{record.get('level')}: {event}"] += 1


def rss_kib(pid: int) -> int | None:
    """The process's resident set size in KiB, from /proc (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Watch:
    """Crashes and memory of the coordinator, sampled every second while the run lasts."""

    crashes: list[str] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    start_rss: int = 0

    async def run(self, coordinator: Coordinator, broker: Broker) -> None:
        silent = 0
        while True:
            await asyncio.sleep(1.0)
            if (code := coordinator.exited()) is not None:
                self.crashes.append(f"exited with status {code}; restarted")
                await coordinator.start()
                continue
            if (rss := rss_kib(coordinator.pid)) is not None:
                self.rss.append(rss)
            try:
                await broker.nc.request(broker.names.routes_reload, b"", timeout=5.0)
                silent = 0
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                silent += 1
            if silent >= 3:
                self.crashes.append("no answer on reach.ctl.routes.reload 3 times; restarted")
                await coordinator.stop()
                await coordinator.start()
                silent = 0


class Publisher:
    """Publishes cases with at most ``--window`` of the last ``--stuck-after`` seconds in
    flight, and gives up when nothing has settled for ``--stall-timeout`` seconds."""

    def __init__(self, ledger: Ledger, args: argparse.Namespace) -> None:
        self._ledger, self._args = ledger, args
        self._recent: deque[tuple[int, float]] = deque()
        self._progress = (ledger.settled, time.monotonic())
        self.count = 0
        self.withheld = 0
        self.stalled: str | None = None

    async def run(self, source) -> None:  # type: ignore[no-untyped-def]
        """Until ``--messages`` are stored (JetStream drops a repeated Nats-Msg-Id)."""
        pending: list[Case] = []
        started = reported = time.monotonic()
        async for case in source:
            if self._withheld(case):
                continue
            pending.append(case)
            if len(pending) < min(100, self._args.messages - self._ledger.stored):
                continue
            await self.publish(pending)
            pending = []
            if self._ledger.stored >= self._args.messages or self.stalled:
                break
            if time.monotonic() - reported >= 30:
                reported = time.monotonic()
                rate = self._ledger.stored / (reported - started)
                print(
                    f"  {self._ledger.stored} stored ({rate:.0f}/s), {self._in_flight()} in flight"
                )
        await source.aclose()

    async def publish(self, cases: list[Case]) -> None:
        numbered = list(enumerate(cases, start=self.count))
        self.count += len(cases)
        await asyncio.gather(*(self._ledger.publish(no, case) for no, case in numbered))
        now = time.monotonic()
        self._recent.extend((no, now) for no, _ in numbered)
        while self._in_flight() >= self._args.window and not self._stall():
            await self._ledger.changed(timeout=1.0)

    def _withheld(self, case: Case) -> bool:
        names = {name.lower() for name in case.headers}
        if names & {name.lower() for name in self._args.without_header}:
            self.withheld += 1
            return True
        return False

    def _in_flight(self) -> int:
        horizon = time.monotonic() - self._args.stuck_after
        recent = self._recent
        while recent and (not self._waiting(recent[0][0]) or recent[0][1] < horizon):
            recent.popleft()
        return sum(1 for no, _ in recent if self._waiting(no))

    def _waiting(self, no: int) -> bool:  # a repeated message id may get no fate of its own
        fate = self._ledger.fates[no]
        return not fate.settled and not self._ledger.shares_id(fate)

    def _stall(self) -> bool:
        settled, since = self._progress
        if self._ledger.settled != settled:
            self._progress = (self._ledger.settled, time.monotonic())
        elif time.monotonic() - since > self._args.stall_timeout:
            self.stalled = f"nothing settled for {self._args.stall_timeout:.0f} s"
            print(f"  stalled: {self.stalled}; publishing stops", flush=True)
        return self.stalled is not None


async def settle(ledger: Ledger, timeout: float) -> None:
    """Until every case is settled, or nothing has settled for ``timeout`` s."""
    last, quiet_since = ledger.settled, time.monotonic()
    while ledger.settled < len(ledger.fates) and time.monotonic() - quiet_since < timeout:
        await ledger.changed(timeout=1.0)
        if ledger.settled != last:
            last, quiet_since = ledger.settled, time.monotonic()


async def run(args: argparse.Namespace, seed: int, workdir: Path) -> int:
    started = time.monotonic()
    async with (
        EmbeddedServer(port=-1, store_dir=workdir / "nats") as server,
        Broker(server.url, name="fuzz-bench") as broker,
    ):
        coordinator = Coordinator(server.url, workdir / "coordinator.log")
        try:
            await coordinator.start()
            watch = Watch(start_rss=rss_kib(coordinator.pid) or 0)
            async with Ledger(broker) as ledger, ledger.agent():
                watcher = asyncio.create_task(watch.run(coordinator, broker))
                try:
                    publisher = Publisher(ledger, args)
                    await publisher.run(chunks(seed, args.generators, args.variants))
                    if not publisher.stalled:  # last: a trap that stalls intake stalls no other
                        await settle(ledger, args.settle_timeout)
                        await publisher.publish(trap_cases(on_wire=True))
                    print(f"  {publisher.count} published; waiting for the rest", flush=True)
                    await settle(ledger, args.settle_timeout)
                    backlog = await drained(broker, timeout=10.0)
                finally:
                    watcher.cancel()
                    await asyncio.gather(watcher, return_exceptions=True)
                end_rss = rss_kib(coordinator.pid) or 0
        finally:
            await coordinator.stop()
    return report(args, seed, ledger, watch, coordinator, backlog, end_rss, started, publisher)


def report(
    args: argparse.Namespace,
    seed: int,
    ledger: Ledger,
    watch: Watch,
    coordinator: Coordinator,
    backlog: dict[str, int],
    end_rss: int,
    started: float,
    publisher: Publisher,
) -> int:
    account = ledger.account()
    elapsed = time.monotonic() - started
    peak = max(watch.rss, default=end_rss)
    growth_mb = (end_rss - watch.start_rss) / 1024
    print()
    print(
        f"seed {seed} (repeat with --seed {seed}): {len(ledger.fates)} messages generated,"
        f" {ledger.stored} stored, in {elapsed:.0f} s ({ledger.stored / elapsed:.0f}/s)"
    )
    print(account.table())
    if publisher.withheld:
        print(f"withheld               {publisher.withheld} (headers {args.without_header})")
    if publisher.stalled:
        print(f"intake stalled         {publisher.stalled}, after {ledger.stored} stored")
    print(f"coordinator crashes    {len(watch.crashes)} {watch.crashes}")
    print(f"REACH_TASKS backlog    {backlog}")
    print(
        f"coordinator RSS        start {watch.start_rss / 1024:.1f} MiB, end {end_rss / 1024:.1f}"
        f" MiB, peak {peak / 1024:.1f} MiB (growth {growth_mb:+.1f} MiB)"
    )
    if coordinator.events:
        print(
            "coordinator warnings   "
            + ", ".join(f"{n} x {e}" for e, n in coordinator.events.most_common(8))
        )
    if account.failures:
        print("\nfailures:")
        print(account.describe_failures())
    broken = (
        publisher.stalled
        or watch.crashes
        or account.failures
        or any(backlog.values())
        or growth_mb > args.rss_growth_mb
    )
    return 1 if broken else 0


async def main() -> int:
    args = arguments()
    seed = args.seed if args.seed is not None else secrets.randbelow(2**32)
    print(f"fuzzing a coordinator with {args.messages} messages, seed {seed}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="reach-fuzz-"))
    try:
        return await run(args, seed, workdir)
    finally:
        if args.keep:
            print(f"kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    configure_logging("error")  # this process's own logs; the coordinator's go to its file
    sys.exit(asyncio.run(main()))
