"""The agent's heartbeats: ``reach_heartbeats/<agent_id>`` every interval ± 20 %.

The coordinator judges them on its own receive time; the agent's clock travels
along only as information (and a jump in it is reported as ``clock_drift``). The
coordinator may ask for another interval on ``reach.ctl.agent.<agent_id>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentreach.broker import Broker, BrokerError, Bucket, Inbound, WrongLastSequence
from agentreach.broker.errors import honour_cancellation
from agentreach.broker.lifecycle import agent_event, emit
from agentreach.envelopes import AgentControl, DecodeError, Heartbeat, decode_as
from agentreach.envelopes.registry import MAX_HEARTBEAT_INTERVAL_S
from agentreach.envelopes.server_answers import NO_HEADERS
from agentreach.errors import ReachError
from agentreach.logs import get_logger

log = get_logger("agents.heartbeats")
REFUSALS_SAID = 10  # of the refused intents a control message names, in its line

JITTER = 0.2
CLOCK_DRIFT_S = 5.0


class Replaced(ReachError):
    """A newer process of this agent id heartbeats: this one is fenced out."""

    def __init__(self, epoch: int) -> None:
        super().__init__(f"a newer process of this agent id heartbeats (epoch {epoch})")
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class Load:
    """What a heartbeat says about the agent's work."""

    in_flight: int
    free_slots: int
    latency_ms: int


def jittered(interval_s: float, rng: random.Random | None = None) -> float:
    """``interval_s`` ± 20 %, so a fleet started together does not beat in step."""
    return interval_s * (1 + (rng or random).uniform(-JITTER, JITTER))


class Heartbeats:
    """Writes a heartbeat every interval ± 20 % and applies the coordinator's instructions."""

    def __init__(
        self,
        broker: Broker,
        agent_id: str,
        epoch: int,
        *,
        interval_s: float,
        load: Callable[[], Load],
        clock: Callable[[], float] = time.time,
        on_replaced: Callable[[int], None] | None = None,
    ) -> None:
        """``on_replaced`` is told the epoch of a newer process of the id once one is found
        heartbeating (this process was stalled or cut off meanwhile); beating then stops."""
        self._broker = broker
        self._agent_id = agent_id
        self._epoch = epoch
        self.interval_s = interval_s
        self._load = load
        self._clock = clock
        self._seq = 0
        self.revision = 0  # of this process's last heartbeat written
        self._wake = asyncio.Event()
        self._last: tuple[float, float] | None = None  # (wall, monotonic) at the last beat
        self._on_replaced = on_replaced
        self.refused: dict[str, str] = {}  # intents the coordinator said it routes us none of

    async def run(self) -> None:
        """Beat until cancelled; a failed write is logged and the next one tried."""
        names = self._broker.names
        bucket = await self._broker.bucket(names.heartbeats_bucket, Heartbeat)
        async with await self._broker.subscribe(
            names.agent_control(self._agent_id), self._on_control
        ):
            while True:
                # Cleared before the beat: a new interval that arrives while the beat is being
                # written must still wake the wait below, or its "beat at once" is lost.
                self._wake.clear()
                try:
                    await self._beat(bucket)
                except Replaced as replaced:
                    log.error(
                        "a newer process of this agent id heartbeats; this one stops",
                        agent_id=self._agent_id,
                        epoch=self._epoch,
                        newer_epoch=replaced.epoch,
                    )
                    if self._on_replaced is not None:
                        self._on_replaced(replaced.epoch)
                    return
                honour_cancellation()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), jittered(self.interval_s))

    async def _beat(self, bucket: Bucket[Heartbeat]) -> None:
        self._seq += 1
        wall, mono = self._clock(), time.monotonic()
        load = self._load()
        beat = Heartbeat(
            agent_id=self._agent_id,
            epoch=self._epoch,
            seq=self._seq,
            interval_s=self.interval_s,
            in_flight=load.in_flight,
            free_slots=load.free_slots,
            latency_ms=load.latency_ms,
            agent_time_ms=int(wall * 1000),
        )
        try:
            self.revision = await self._write(bucket, beat)
        except BrokerError as exc:
            log.warning("heartbeat not written", error=str(exc))
        await self._check_clock(wall, mono)

    async def _write(self, bucket: Bucket[Heartbeat], beat: Heartbeat) -> int:
        """Write ``beat`` on this process's last one: a write in between was another
        process's, and one of a higher epoch fences this process out (raises Replaced).
        Anything else in between (a store that came back empty) is written over."""
        if self.revision:
            try:
                return await bucket.update(self._agent_id, beat, last=self.revision)
            except WrongLastSequence:
                try:
                    current = await bucket.get(self._agent_id)
                except DecodeError:
                    current = None
                if current is not None and current.value.agent_id != self._agent_id:
                    # Written with this agent's creds, by no process of this id: no fence.
                    log.warning(
                        "a heartbeat on this agent's key names another agent; written over",
                        named=current.value.agent_id,
                        epoch=current.value.epoch,
                    )
                elif current is not None and current.value.epoch > self._epoch:
                    raise Replaced(current.value.epoch) from None
        return await bucket.put(self._agent_id, beat)

    async def retire(self) -> None:
        """Delete the heartbeat (the coordinator then knows at once that the agent stopped),
        unless another process wrote one since this process's last: that one is live."""
        bucket = await self._broker.bucket(self._broker.names.heartbeats_bucket, Heartbeat)
        try:
            await bucket.delete(self._agent_id, last=self.revision or None)
        except WrongLastSequence:
            log.warning("another process heartbeats for this agent id; its heartbeat stands")

    async def _check_clock(self, wall: float, mono: float) -> None:
        last, self._last = self._last, (wall, mono)
        if last is None:
            return
        drift = (wall - last[0]) - (mono - last[1])
        if abs(drift) > CLOCK_DRIFT_S:
            log.warning("clock drift", drift_s=round(drift, 3))
            with contextlib.suppress(BrokerError):
                drifted = agent_event(self._agent_id, "clock_drift", drift_s=round(drift, 3))
                await emit(self._broker, drifted, sender=self._agent_id)

    async def _on_control(self, msg: Inbound) -> None:
        if not msg.headers:  # the coordinator's carry one: a server's answer (no_hdr) is nobody's
            log.warning("ignoring a control message without headers", why=NO_HEADERS)
            return
        if msg.headers.get("Reach-Kind") != "control":  # any other headers: not the coordinator's
            log.warning("ignoring a control message without the header Reach-Kind: control")
            return
        try:
            control = decode_as(msg.data, AgentControl)
        except DecodeError as exc:
            log.warning("ignoring unreadable control message", error=str(exc))
            return
        if control.refused and control.refused != self.refused:
            self.refused = dict(control.refused)
            log.warning(
                "the coordinator routes this agent no task of these intents",
                agent_id=self._agent_id,
                refused=dict(list(self.refused.items())[:REFUSALS_SAID]),  # a line, not a flood
                count=control.refused_count or len(self.refused),
            )
        interval = control.heartbeat_interval_s
        if interval is not None and interval > MAX_HEARTBEAT_INTERVAL_S:
            # Beats of a longer interval are ignored by the coordinator (protocol §7): the
            # agent would look silent. No coordinator asks for one; someone else did.
            log.warning("ignoring a heartbeat interval over 300 s", interval_s=interval)
            return
        if interval and interval > 0:
            log.info("heartbeat interval changed", interval_s=interval)
            self.interval_s = control.heartbeat_interval_s
            self._wake.set()  # beat now, so the coordinator sees the new interval at once
