"""Clauses about an agent at rest: its card, its consumers, its probes, its heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from agentreach import envelopes
from agentreach.broker import BrokerTimeout, NoResponders, consumer_state
from agentreach.broker.presence import SERVICE_NAME, ask, probe_inbox
from agentreach.broker.requests import gather_replies
from agentreach.broker.streams import last_message
from agentreach.conformance.report import Checks, Failed
from agentreach.conformance.session import Session
from agentreach.envelopes import PRIORITIES, AgentCard, AgentControl, DecodeError, Heartbeat

CADENCE_S = 0.5  # the interval the kit asks for while it watches the beats
BEATS = 12
FIRST_BEAT_S = 2.0  # "at once" after the card: what the first heartbeat may take to be stored
WAKE_PROBES = 25  # pairs of control messages, the second later by one more step each time
WAKE_STEP_S = 0.0002
# Back to 0.5 s from the agent's own interval: a beat within half of that (and 3 s) is one
# not left for the interval; an interval under this is too short to tell.
REVERSED_FROM_S = 3.0
JITTER_STDEV_S = 0.025  # ±20 % of 0.5 s spreads gaps far wider; no jitter at all does not
BAD_HEADER_BEATS = 3  # intervals at the kit's cadence an agent has to beat over a bad header
# Four heartbeat intervals at the kit's cadence (with jitter), and the agent's own look.
CARD_AGAIN_S = 4 * CADENCE_S * 1.2 + 2.0
BUSY_MS = 1_500  # each of the tasks that keep the agent busy while its beats are watched


async def card(s: Session, c: Checks) -> str:
    """§5: the card is a valid record, running, with an epoch, serving the topic."""
    found = await s.card()
    c.must(found.agent_id == s.agent_id, f"card says agent_id {found.agent_id!r}")
    c.must(found.status == "running", f"card status is {found.status!r}, not 'running'")
    c.must(found.epoch >= 1, f"card epoch is {found.epoch}")
    c.must(s.topic in found.intents, f"card does not list the topic {s.topic!r}")
    bucket = s.names.agents_bucket
    stored = await last_message(s.broker, f"KV_{bucket}", f"$KV.{bucket}.{s.agent_id}")
    c.must(
        stored is not None and bool(stored.headers),
        "the card written with a header (Reach-Kind: record, §5 since revision 34): a value"
        " with none is what a direct get's no_hdr copies onto any key",
    )
    for topic, intent in found.intents.items():
        c.must(intent.capacity >= 1, f"intent {topic!r} has capacity {intent.capacity}")
    c.should(bool(found.host) and found.pid > 0, "host and pid describe the process")
    c.should(found.started_at > 0, "started_at is the registration time")
    return f"running, epoch {found.epoch}, intents {sorted(found.intents)}"


async def consumers(s: Session, c: Checks) -> str:
    """§6: three durable pull consumers with the settings the protocol fixes."""
    found = await s.card()
    capacity = sum(intent.capacity for intent in found.intents.values())
    shown = []
    for priority in PRIORITIES:
        stream = s.names.dispatch_stream(priority)
        durable = s.names.agent_consumer(s.agent_id, priority)
        state = await consumer_state(s.broker, stream, durable)
        c.must(state is not None, f"no consumer {durable} on {stream}")
        assert state is not None
        spec, where = state.spec, f"{durable}:"
        subject = s.names.dispatch(s.agent_id, priority)
        c.must(spec.filter_subjects == (subject,), f"{where} filter {spec.filter_subjects}")
        c.must(state.ack_policy == "explicit", f"{where} ack policy {state.ack_policy}")
        c.must(state.deliver_policy == "all", f"{where} deliver policy {state.deliver_policy}")
        c.must(spec.max_deliver >= 1, f"{where} max deliver {spec.max_deliver} is unlimited")
        c.must(
            capacity <= spec.max_ack_pending <= 2 * capacity,
            f"{where} max ack pending {spec.max_ack_pending}, not from the card's capacity"
            f" {capacity} to twice it",
        )
        c.must(spec.ack_wait_s > 0, f"{where} no ack wait")
        c.should(spec.inactive_threshold_s is None, f"{where} has an inactive threshold")
        shown.append(priority.lower())
    return (
        f"agent-{s.agent_id}-{'/'.join(shown)}: ack wait {spec.ack_wait_s:g} s,"
        f" max ack pending {spec.max_ack_pending} (capacity {capacity}),"
        f" max deliver {spec.max_deliver}"
    )


async def probes(s: Session, c: Checks) -> str:
    """§9: presence and the micro-service ping answer; `nats micro` lists the agent."""
    for subject, timeout_s, what in (
        (s.names.presence(s.agent_id), 3.0, "presence"),
        (s.names.ping(s.agent_id), 5.0, "ping"),
    ):
        try:
            await ask(s.broker, subject, timeout_s)  # as the coordinator asks (§9)
        except NoResponders:
            raise Failed(f"nobody subscribes to {subject} ({what})") from None
        except BrokerTimeout:
            raise Failed(f"{what} on {subject} not answered within {timeout_s:g} s") from None
    discovery = f"$SRV.INFO.{SERVICE_NAME}"
    answers = await gather_replies(s.broker, discovery, wait_s=1.0, inbox=probe_inbox(s.broker))
    instances = [_json_object(answer) for answer in answers]
    mine = [i for i in instances if (i.get("metadata") or {}).get("agent_id") == s.agent_id]
    c.should(len(mine) == 1, f"one '{SERVICE_NAME}' micro service instance for the agent")
    if mine:
        subjects = [e.get("subject") for e in mine[0].get("endpoints") or []]
        c.should(s.names.ping(s.agent_id) in subjects, "the micro service's ping endpoint subject")
    return f"presence and ping answer; {len(mine)} '{SERVICE_NAME}' instance listed"


async def heartbeats(s: Session, c: Checks) -> str:
    """§7, §8: heartbeats with the card's epoch, a new interval followed at once, beats
    every interval ± 20 % with jitter, then the old interval again."""
    epoch = (await s.card()).epoch
    bucket = await s.broker.bucket(s.names.heartbeats_bucket, Heartbeat)
    # Written at once after the card, so a moment after it: looked for, not read once.
    stored = await s.poll(lambda: bucket.get(s.agent_id), FIRST_BEAT_S)
    c.must(stored is not None, f"no heartbeat in {s.names.heartbeats_bucket}")
    assert stored is not None
    first = stored.value
    c.must(first.epoch == epoch, f"heartbeat epoch {first.epoch}, card epoch {epoch}")
    c.must(first.interval_s > 0 and first.seq >= 1, "interval_s > 0 and seq >= 1")
    async with _kept_busy(s):
        return await _watched_beats(s, c, epoch, first.interval_s)


async def _watched_beats(s: Session, c: Checks, epoch: int, restore_s: float) -> str:
    """The beats at the kit's cadence, the card and the heartbeat key spoiled, the wake-up
    probes; ``restore_s`` asked for again at the end."""
    asked_at = s.now()
    start = len(s.beats)
    await _ask_interval(s, CADENCE_S)
    adopted = await s.until(
        lambda: _first(s, start, lambda b: b.interval_s == CADENCE_S),
        3.0,
        f"heartbeat with interval_s {CADENCE_S} after the control message",
    )
    c.should(adopted - asked_at < 0.5, "a heartbeat at once after a new interval")
    begin = len(s.beats) - 1
    await s.until(
        lambda: True if len(s.beats) - begin > BEATS else None,
        BEATS * CADENCE_S * 1.2 + 3,
        f"{BEATS + 1} heartbeats at {CADENCE_S} s",
    )
    beats = s.beats[begin : begin + BEATS + 1]
    bodies = [b.body for b in beats]
    c.must(all(isinstance(b, Heartbeat) for b in bodies), f"unreadable heartbeat: {bodies}")
    seqs = [b.seq for b in bodies]
    c.must(seqs == sorted(set(seqs)), f"seq does not rise: {seqs}")
    c.should(seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"seq rises by 1: {seqs}")
    c.must(all(b.epoch == epoch for b in bodies), "every heartbeat carries the card's epoch")
    c.must(
        all(b.headers for b in beats),
        "every heartbeat written with a header (Reach-Kind: record, §7 since revision 34): a"
        " value with none is what a direct get's no_hdr copies onto any key",
    )
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(beats)]
    shown = ", ".join(f"{g:.2f}" for g in gaps)
    # Jitter is judged on the agent's own clock where every beat carries it: receive times
    # add the server's and this process's delays, which on a busy machine looked like jitter
    # in an agent that had none.
    stamps = [b.agent_time_ms / 1000 for b in bodies]
    sent_gaps = [b - a for a, b in itertools.pairwise(stamps)] if all(stamps) else gaps
    mean = statistics.fmean(gaps)
    # Generous bounds: the kit sees receive times, on a machine that may be busy.
    c.must(0.42 <= mean <= 0.6, f"mean gap {mean:.3f} s, not {CADENCE_S} s: {shown}")
    c.must(all(0.25 <= g <= 1.0 for g in gaps), f"a gap far outside ±20 %: {shown}")
    c.should(all(0.3 <= g <= 0.75 for g in gaps), f"every gap within ±20 % (+0.1 s): {shown}")
    spread = statistics.pstdev(sent_gaps)
    c.must(spread >= JITTER_STDEV_S, f"no jitter: gaps {shown} (stdev {spread:.3f} s)")
    c.should(
        await _card_written_again(s),
        f"the card, overwritten with something that is no card, written again within"
        f" {CARD_AGAIN_S:g} s (§4: looked at every few heartbeat intervals)",
    )
    await _beats_over_a_bad_header(s)
    await _wake_during_write(s, restore_s)
    return (
        f"epoch {epoch}; at {CADENCE_S} s: mean gap {mean:.3f} s, stdev {spread:.3f} s;"
        f" interval {restore_s:g} s restored"
    )


@contextlib.asynccontextmanager
async def _kept_busy(s: Session) -> AsyncIterator[None]:
    """A task in the agent's hands all along, one after another: the coordinator doubles
    the interval of an agent idle for a while, which would answer the kit's probes with
    another interval. (One long task ran out while a careless agent's card was waited for.)"""
    done = asyncio.Event()

    async def one_after_another() -> None:
        while not done.is_set():
            busy = await s.dispatch(s.task({"op": "sleep", "ms": BUSY_MS}))
            await s.until(
                lambda: busy.replies_of("result") or None,  # noqa: B023
                BUSY_MS / 1000 + 15.0,
                "a busy task's result",
            )

    relay = asyncio.create_task(one_after_another())
    try:
        yield
    except BaseException:
        relay.cancel()
        raise
    done.set()
    await relay  # its last task's result, and any failure of it


async def _card_written_again(s: Session) -> bool:
    """§4: the card overwritten by hand (with bytes that are no card) while the agent beats
    every ``CADENCE_S``: whether it writes it again, as it was, within ``CARD_AGAIN_S``.
    When it does not, the kit puts it back (the clauses after it route by the card)."""
    cards = await s.broker.bucket(s.names.agents_bucket, AgentCard)
    card = await s.card()
    await s.broker.publish(f"$KV.{s.names.agents_bucket}.{s.agent_id}", b"no card")

    async def readable() -> AgentCard | None:
        with contextlib.suppress(DecodeError):
            entry = await cards.get(s.agent_id)
            return entry.value if entry is not None else None
        return None

    if await s.poll(readable, CARD_AGAIN_S) == card:
        return True
    await cards.put(s.agent_id, card)
    return False


async def _beats_over_a_bad_header(s: Session) -> None:
    """§2: the heartbeat key holding a stored header line a client library may refuse (any
    party can have the server copy one there): the agent reads it as nobody's and beats on.
    nats.js 2.x closed its connection on reading it, at every beat."""
    subject = f"$KV.{s.names.heartbeats_bucket}.{s.agent_id}"
    bad = await s.broker.publish_header_block(subject, b"NATS/1.0\r\nBad Key: x\r\n\r\n", b"{}")
    beats = await s.broker.bucket(s.names.heartbeats_bucket, Heartbeat)

    async def beat_over_it() -> bool | None:
        with contextlib.suppress(DecodeError):
            entry = await beats.get(s.agent_id)
            return True if entry is not None and entry.revision > bad else None
        return None

    if await s.poll(beat_over_it, BAD_HEADER_BEATS * CADENCE_S * 1.2 + 2) is None:
        raise Failed(
            "no heartbeat written over one whose header block holds `Bad Key: x` (§2: read"
            " such an entry as nobody's; nats.js's kv.get closes the connection on it)"
        )


async def _wake_during_write(s: Session, restore_s: float) -> None:
    """§8: a new interval that arrives while a beat is being written still gets its beat at
    once. The kit cannot see the write; it asks for one interval (a beat starts) and then,
    a moment later, for another, at spacings from 0 to a few milliseconds: an agent that
    clears its wake-up after the write misses one of them, and is silent for the interval it
    waits. Both orders: ``CADENCE_S`` then ``restore_s``, and back, since an agent that
    waits the interval it read before the write is silent only when the second is the
    shorter (an outside Go agent's mutation passed the first order alone)."""
    for step in range(WAKE_PROBES):
        await _pair(s, CADENCE_S, restore_s, step * WAKE_STEP_S, wait_s=3.0)
    if restore_s < REVERSED_FROM_S:
        return
    start = len(s.beats)
    await _ask_interval(s, CADENCE_S)
    await s.until(lambda: _first(s, start, _of(CADENCE_S)), 3.0, f"{CADENCE_S} s again")
    for step in range(WAKE_PROBES):
        await _pair(s, restore_s, CADENCE_S, step * WAKE_STEP_S, wait_s=min(3.0, restore_s / 2))
    start = len(s.beats)
    await _ask_interval(s, restore_s)
    await s.until(
        lambda: _first(s, start, _of(restore_s)),
        3.0,
        f"heartbeat with interval_s {restore_s:g} at once, asked for again",
    )


async def _pair(s: Session, first_s: float, then_s: float, spacing_s: float, *, wait_s: float):
    """Ask for ``first_s`` and, ``spacing_s`` later, for ``then_s``: a beat with ``then_s``
    must follow the first one with ``first_s`` within ``wait_s``."""
    start = len(s.beats)
    await _ask_interval(s, first_s)
    await s.broker.flush()  # the first is on its way before the second is sent
    until = time.perf_counter() + spacing_s
    while time.perf_counter() < until:  # finer than the event loop's sleep
        pass
    await _ask_interval(s, then_s)

    def after_the_first() -> float | None:  # both read before the beat began: one beat
        firsts = [i for i, beat in enumerate(s.beats[start:]) if _interval(beat) == first_s]
        return _first(s, start + (firsts[-1] + 1 if firsts else 0), _of(then_s))

    await s.until(
        after_the_first,
        wait_s,
        f"heartbeat with interval_s {then_s:g} at once, asked for"
        f" {spacing_s * 1000:.1f} ms after {first_s:g} s (during that beat's write?)",
    )


async def _ask_interval(s: Session, interval_s: float) -> None:
    control = envelopes.encode(AgentControl(heartbeat_interval_s=interval_s))
    await s.broker.publish_core(
        s.names.agent_control(s.agent_id), control, headers={"Reach-Kind": "control"}
    )


def _interval(beat: Any) -> float | None:
    return beat.body.interval_s if isinstance(beat.body, Heartbeat) else None


def _of(interval_s: float):  # type: ignore[no-untyped-def]
    return lambda body: body.interval_s == interval_s


def _first(s: Session, start: int, match) -> float | None:  # type: ignore[no-untyped-def]
    """The receive time of the first heartbeat from ``start`` on that ``match`` accepts."""
    for beat in s.beats[start:]:
        if isinstance(beat.body, Heartbeat) and match(beat.body):
            return beat.at
    return None


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        found = envelopes.decode_json(data)
    except envelopes.DecodeError:
        return {}
    return found if isinstance(found, dict) else {}
