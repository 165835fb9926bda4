"""Fuzz cases through a real nats-server and coordinator, and an account of each one.

Every case is published on ``reach.task.<topic>`` with an ``X-Fuzz-Case`` header, which
intake keeps (a dead letter carries the raw headers, a task its custom headers). A
:class:`Ledger` then learns each case's fate from the fuzz agent (it ran the task) and from
``reach.dlq.>`` (reason and error), and :meth:`Ledger.account` checks every fate against
the case's verdict. The suite's end-to-end test and ``bench/fuzz.py`` share it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors

from agentreach import envelopes
from agentreach.agents import Agent, TaskContext
from agentreach.broker import Broker
from agentreach.envelopes import DecodeError
from tests.fuzz.contract import TOPIC, Case, is_path, names_fault, path_of
from tests.fuzz.headers import CASE_HEADER

AGENT_ID = "fuzz-agent"
SHOWN = 3  # examples kept per kind of failure


@dataclass
class Fate:
    """What became of one published case; the case itself is kept only as text."""

    shown: str
    verdict_kind: str
    paths: frozenset[str]
    ids: set[str]
    skipped: str | None = None  # never stored in REACH_TASKS, and why
    dispatched: int = 0
    letters: list[tuple[str, str]] = field(default_factory=list)  # (reason, error message)

    @property
    def settled(self) -> bool:
        return self.skipped is not None or self.dispatched > 0 or bool(self.letters)


@dataclass
class Account:
    """Counts over every case, and the failures with a few examples each."""

    published: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    dispatched: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    unsettled: int = 0
    deduplicated: int = 0
    bad: int = 0
    bad_with_path: int = 0
    good: int = 0
    good_routed: int = 0
    foreign: int = 0
    failures: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter[str] = field(default_factory=Counter)

    def fail(self, kind: str, example: str) -> None:
        self.counts[kind] += 1
        if len(self.failures[kind]) < (SHOWN * 4 if kind.startswith("unsettled") else SHOWN):
            self.failures[kind].append(example)

    def table(self) -> str:
        """The account as lines for a terminal."""
        pct = 100.0 * self.bad_with_path / self.bad if self.bad else 100.0
        lines = [
            f"published              {self.published}",
            f"not stored (skipped)   {sum(self.skipped.values())} {dict(self.skipped)}",
            f"dispatched to agent    {self.dispatched}",
            f"dead-lettered          {sum(self.dead_letters.values())} {dict(self.dead_letters)}",
            f"same id as another     {self.deduplicated} (one message by contract, settled once)",
            f"unsettled              {self.unsettled}",
            f"bad inputs             {self.bad}; dead-lettered naming the path: "
            f"{self.bad_with_path} ({pct:.2f} %)",
            f"good inputs            {self.good}; routed to the agent: {self.good_routed}",
            f"foreign messages       {self.foreign} (not published by the fuzzer)",
        ]
        return "\n".join(lines)

    def describe_failures(self) -> str:
        out = []
        for kind, examples in sorted(self.failures.items(), key=lambda kv: -self.counts[kv[0]]):
            out.append(f"- {self.counts[kind]} of {kind}")
            out.extend(f"    e.g. {example}" for example in examples)
        return "\n".join(out)


class Ledger:
    """Publishes cases and follows each one's fate, awaiting them as they arrive."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.fates: dict[int, Fate] = {}
        self.foreign: list[str] = []
        self._holders: dict[str, list[int]] = defaultdict(list)  # stored cases by message id
        self._changed = asyncio.Condition()
        self._sub: nats.aio.subscription.Subscription | None = None
        self.settled = 0  # cases with a fate (skipped ones included)
        self.stored = 0  # cases JetStream stored in REACH_TASKS

    async def __aenter__(self) -> Ledger:
        nc = self._broker.nc
        self._sub = await nc.subscribe(self._broker.names.dlq_wildcard, cb=self._on_letter)
        await nc.flush()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    @contextlib.asynccontextmanager
    async def agent(self, *, capacity: int = 64) -> AsyncIterator[Broker]:
        """The agent serving the fuzz topic, on a connection of its own (so that what it
        does to it cannot blind the ledger): it records each task it is handed."""
        agent = Agent(AGENT_ID, startup_delay=0)

        @agent.handler(TOPIC, capacity=capacity)
        async def run(ctx: TaskContext, payload: object) -> None:
            await self._record(ctx.envelope.headers.get(CASE_HEADER), None, ctx.message_id)

        names = self._broker.names
        async with (
            Broker(self._broker.url, names=names, name=AGENT_ID) as own,
            agent.running(broker=own),
        ):
            yield own

    async def publish(self, no: int, case: Case) -> None:
        """Publish ``case`` as case ``no``; a message JetStream does not store is skipped."""
        fate = Fate(case.show(), case.verdict.kind, case.verdict.paths, case.ids())
        self.fates[no] = fate
        for message_id in fate.ids:  # before the await: cases are published concurrently
            self._holders[message_id].append(no)
        fate.skipped = await self._publish(no, case)
        if fate.skipped is not None:  # never stored: it claims nothing
            for message_id in fate.ids:
                self._holders[message_id].remove(no)
            self.settled += 1
        else:
            self.stored += 1

    async def _publish(self, no: int, case: Case) -> str | None:
        """Publish; why JetStream did not store the message, if it did not."""
        headers = {**case.headers, CASE_HEADER: str(no)}
        if _size(case.body, headers) > self._broker.nc.max_payload:
            # nats-py checks the body alone; the server counts the headers too, and closes
            # the connection of a client that sends more.
            return "over max_payload"
        subject = self._broker.names.task(case.topic)
        try:
            ack = await self._broker.js.publish(subject, case.body, headers=headers, timeout=10)
        except nats.errors.MaxPayloadError:
            return "over max_payload"
        except nats.js.errors.APIError as exc:
            return f"refused by JetStream: {exc.description}"
        return "duplicate Nats-Msg-Id" if ack.duplicate else None

    def shares_id(self, fate: Fate) -> bool:
        """Whether another stored case has one of ``fate``'s message ids: by the contract
        they are one message, which may be dispatched or dead-lettered only once."""
        return any(len(self._holders[i]) > 1 for i in fate.ids)

    def id_settled(self, fate: Fate) -> bool:
        """Whether ``fate`` or another case with one of its message ids has a fate."""
        return fate.settled or any(
            self.fates[other].settled for i in fate.ids for other in self._holders[i]
        )

    async def until_settled(self, nos: Iterable[int], timeout: float) -> list[int]:
        """Wait until each of ``nos`` has a fate (or one with the same message id has), at
        most ``timeout`` s; the ones without."""
        waiting = list(nos)
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(
                    lambda: all(self.id_settled(self.fates[n]) for n in waiting)
                )
        except TimeoutError:
            pass
        return [n for n in waiting if not self.id_settled(self.fates[n])]

    async def changed(self, timeout: float) -> None:
        """Until the next fate arrives, at most ``timeout`` s."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait()

    async def _on_letter(self, msg: nats.aio.msg.Msg) -> None:
        try:
            letter = envelopes.decode_dead_letter(msg.data)
        except DecodeError as exc:
            self.foreign.append(f"{msg.subject}: not a dead letter ({exc}): {msg.data[:120]!r}")
            return
        headers = letter.envelope.headers if letter.envelope is not None else letter.headers
        error = letter.error.message if letter.error is not None else ""
        await self._record(headers.get(CASE_HEADER), (letter.reason, error), letter.message_id)

    async def _record(self, case: str | None, letter: tuple[str, str] | None, mid: str) -> None:
        fate = self.fates.get(int(case)) if case and case.isdigit() else None
        if fate is None:
            what = f"dead letter {letter}" if letter else "task handed to the agent"
            self.foreign.append(f"{what}, message {mid}, without a case of ours")
            return
        was = fate.settled
        if letter is None:
            fate.dispatched += 1
        else:
            fate.letters.append(letter)
        if not was:
            self.settled += 1
        async with self._changed:
            self._changed.notify_all()

    def account(self) -> Account:
        """Check every fate against its verdict."""
        account = Account(foreign=len(self.foreign))
        if self.foreign:  # a reply or a forged message that landed in our streams
            kind = "foreign message (not published by the fuzzer)"
            account.counts[kind], account.failures[kind] = len(self.foreign), self.foreign[:SHOWN]
        for fate in self.fates.values():
            _judge(fate, account, self.id_settled(fate))
        return account


def _judge(fate: Fate, account: Account, id_settled: bool) -> None:
    if fate.skipped is not None:
        account.skipped[fate.skipped] += 1
        return
    account.published += 1
    account.dispatched += fate.dispatched > 0
    for reason, _ in fate.letters:
        account.dead_letters[reason] += 1
    if not fate.settled:
        if id_settled:
            account.deduplicated += 1
        else:
            account.unsettled += 1
            account.fail("unsettled: neither dispatched nor dead-lettered", fate.shown)
        return
    invalid = [message for reason, message in fate.letters if reason == "invalid_envelope"]
    if fate.verdict_kind == "bad":
        account.bad += 1
        if fate.dispatched:
            account.fail("bad input dispatched to the agent", fate.shown)
        if not invalid:
            reasons = sorted({r for r, _ in fate.letters}) or ["none"]
            account.fail(f"bad input not dead-lettered invalid_envelope ({reasons})", fate.shown)
        elif any(names_fault(path_of(m) or "", m, fate.paths) for m in invalid):
            account.bad_with_path += 1
    if fate.verdict_kind == "ok":
        account.good += 1
        account.good_routed += fate.dispatched > 0
        if invalid:
            account.fail("valid input dead-lettered invalid_envelope", f"{fate.shown} -> {invalid}")
    for message in invalid:
        path = path_of(message)
        if not is_path(path):
            account.fail("dead letter's reason names no path", f"{fate.shown} -> {message!r}")
        elif fate.verdict_kind != "ok" and not names_fault(path or "", message, fate.paths):
            account.fail(f"reason names {path}, not the fault", f"{fate.shown} -> {message!r}")
    if fate.dispatched > 1:
        account.fail("handed to the agent more than once", fate.shown)


def _size(body: bytes, headers: dict[str, str]) -> int:
    """What a message weighs against max_payload: its body and its header block."""
    block = sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return len(body) + len("NATS/1.0\r\n\r\n") + block


async def intake_backlog(broker: Broker) -> dict[str, int]:
    """What REACH_TASKS still holds and what the intake consumer has not settled."""
    names = broker.names
    stream = await broker.js.stream_info(names.tasks_stream)
    consumer = await broker.js.consumer_info(names.tasks_stream, names.coordinator_intake)
    return {
        "stored": stream.state.messages,
        "num_pending": consumer.num_pending or 0,
        "num_ack_pending": consumer.num_ack_pending or 0,
    }


async def drained(broker: Broker, timeout: float) -> dict[str, int]:
    """The intake backlog once it is empty, or as it is after ``timeout`` s.

    No event says "acknowledged": after the last fate arrived, the coordinator's ack is
    one round trip behind, so this polls the consumer (briefly, with backoff).
    """
    backlog = await intake_backlog(broker)
    delay = 0.02
    deadline = asyncio.get_running_loop().time() + timeout
    while any(backlog.values()) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)
        backlog = await intake_backlog(broker)
    return backlog
