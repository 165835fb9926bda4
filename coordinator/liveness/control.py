"""What agents and operators ask of the liveness side: a registration slot (rate limited
per coordinator replica, so a fleet that starts at once registers in waves) and the
lifting of a quarantine (``reach agents clear``)."""

from __future__ import annotations

import time

import structlog

from agentreach import envelopes
from agentreach.broker import Inbound
from agentreach.coordinator.liveness.config import LivenessConfig
from agentreach.coordinator.liveness.monitor import LivenessMonitor
from agentreach.coordinator.protection.rate_limits import TokenBucket
from agentreach.envelopes import (
    DecodeError,
    RegisterReply,
    RegisterRequest,
    decode_as,
)

log = structlog.get_logger("coordinator.liveness")

AGENT_EVERY_S = 1.0  # a slot for one agent id at most this often
GRANTS_KEPT = 10_000


class LivenessControl:
    """Answers ``reach.ctl.register.<agent_id>`` and ``reach.ctl.clear``."""

    def __init__(self, config: LivenessConfig, monitor: LivenessMonitor) -> None:
        self._monitor = monitor
        self._registrations = TokenBucket(config.registration_rate, config.registration_burst)
        self._granted: dict[str, float] = {}  # agent id → when it was last given a slot
        self._turns_until = 0.0  # the last turn given to a refused agent (monotonic)

    def _own_turn(self, agent_id: str) -> float:
        """Seconds until ``agent_id`` may have a slot again: one a second at most, so that an
        agent asking in a loop cannot take every slot the others need (0.0: now)."""
        now = time.monotonic()
        if len(self._granted) > GRANTS_KEPT:  # an agent given a slot long ago is forgotten
            self._granted = {a: t for a, t in self._granted.items() if now - t < AGENT_EVERY_S}
        return max(0.0, self._granted.get(agent_id, -AGENT_EVERY_S) + AGENT_EVERY_S - now)

    def _turn(self, token_in_s: float) -> float:
        """Seconds until a refused agent's turn: the token after those promised to the agents
        refused before it. Told when the next token comes, a crowd of 200 came back together
        every 20 ms (10,000 requests a second for 50 slots)."""
        now = time.monotonic()
        turn = max(now + token_in_s, self._turns_until)
        self._turns_until = turn + 1 / self._registrations.rate
        return turn - now

    async def on_register(self, msg: Inbound) -> None:
        """An agent asks on ``reach.ctl.register.<agent_id>`` as itself; a body naming
        another agent is refused. One that is no request takes no slot: a direct get's bare
        copy, in any id's name, took the slots every agent shares (a security re-test)."""
        if not msg.answerable:
            log.debug("a registration that is no request ignored", subject=msg.subject)
            return
        try:
            request = decode_as(msg.data, RegisterRequest)
        except DecodeError as exc:
            await _refuse(msg, f"unreadable registration request: {exc}")
            return
        if (sender := msg.subject.rsplit(".", 1)[-1]) != request.agent_id:
            log.warning("registration as another agent refused", subject=msg.subject)
            why = f"the body names agent {request.agent_id!r}, the subject {sender!r}"
            await _refuse(msg, why)
            return
        own_s = self._own_turn(request.agent_id)
        wait_s = own_s or self._registrations.take()
        if wait_s == 0.0:
            self._granted[request.agent_id] = time.monotonic()
        elif not own_s:
            wait_s = self._turn(wait_s)
        reply = RegisterReply(ok=wait_s == 0.0, retry_after_ms=int(wait_s * 1000) + 1)
        if not reply.ok:
            log.info("too many registrations; asked to retry", retry_after_ms=reply.retry_after_ms)
        await msg.respond(envelopes.encode(reply))

    async def on_clear(self, msg: Inbound) -> None:
        """Every replica hears it; the one judging liveness (holding its lease) answers."""
        if not self._monitor.active:
            return
        if not msg.answerable:
            # `reach agents clear` asks; a direct get's no_hdr copy of an agent's own id (its
            # quarantine lifted "by an operator") has nowhere to be answered.
            log.warning("a clear that is no request ignored", data=msg.data[:100])
            return
        agent_id = msg.data.decode(errors="replace")
        await msg.respond((await self._monitor.clear(agent_id)).encode())


async def _refuse(msg: Inbound, why: str) -> None:
    """A request that asking again cannot fix: said, so an agent with the bug stops."""
    await msg.respond(envelopes.encode(RegisterReply(ok=False, error=why)))
