"""Token buckets: per topic (at intake) and per agent, as this replica enforces them; the
configuration of callers' quotas too, which every replica shares (:mod:`.quotas`)."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from agentreach.coordinator.units import NonNegativeSeconds
from agentreach.envelopes import AgentCard, RateLimit, Task
from agentreach.envelopes.messages import Token
from agentreach.logs import RepeatedLines, get_logger

log = get_logger("coordinator.rate_limits")

# The quota of every caller not named in ``RateLimits.callers``.
DEFAULT_CALLER = "default"
KEPT_LETTER_PACES = 10_000  # callers whose pace of dead letters is kept (least recent go)
UNLETTERED_SAID_EVERY_S = 60.0


class RateLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Token buckets per topic (at intake), per agent (overriding the agent's card) and
    per caller.

    Over a topic's or an agent's limit a task waits at most ``wait_s``, then is rejected
    as ``rate_limited``; each coordinator replica keeps its own buckets of those, a topic's
    shared fairly by its callers (:class:`TopicBucket`). Callers'
    quotas (``callers``: ``default`` for everyone not named) are one bucket per caller in
    KV, shared by every replica; a task over its caller's quota is refused at once, and so is
    a workflow signal or cancel of the caller's (each takes a token too).
    """

    topics: dict[str, RateLimit] = {}
    agents: dict[str, RateLimit] = {}
    callers: dict[Token, RateLimit] = {}
    wait_s: NonNegativeSeconds = 0.1

    def caller_quota(self, caller: str) -> tuple[str, RateLimit] | None:
        """``caller``'s quota and its name there (the caller's, else ``default``); None
        when it has none."""
        for name in (caller, DEFAULT_CALLER):
            if (limit := self.callers.get(name)) is not None:
                return name, limit
        return None


class TokenBucket:
    """``capacity`` tokens of burst, refilled at ``rate`` per second."""

    def __init__(
        self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._at = clock()

    def take(self, need: float = 1.0) -> float:
        """Take a token if ``need`` are there: 0.0 when granted, else the seconds until they
        will be."""
        wait = self.wait(need)
        if wait == 0.0:
            self._tokens -= 1
        return wait

    def wait(self, need: float = 1.0) -> float:
        """Seconds until ``need`` tokens are there (0.0: now), taking nothing."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        return 0.0 if self._tokens >= need else (need - self._tokens) / self.rate


class TopicBucket:
    """A topic's token bucket, shared fairly by the callers asking for it at once.

    Alone, a caller may take every token. When several have asked within ``ACTIVE_S``, each
    has a share of the rate (rate ÷ callers) and of the burst: within its share a caller
    takes any token; past it, only tokens above a reserve kept for the others (the burst's
    part that is theirs). So a caller within its quota but over a topic's rate no longer
    keeps the bucket empty for everyone (a security re-test: 90 tasks/s against a topic's
    50/s had half of another caller's 20/s refused), and tokens nobody else wants still go
    to whoever asks: the topic's whole rate is used.
    """

    ACTIVE_S = 2.0  # a caller that asked within this long shares the topic
    PRUNE_S = 0.1

    def __init__(self, limit: RateLimit, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._bucket = TokenBucket(limit.rate, limit.burst, clock)
        self._asked: dict[str | None, float] = {}  # caller → when it last asked
        self._shares: dict[str | None, TokenBucket] = {}
        self._pruned = clock()

    def take(self, caller: str | None) -> float:
        """Take a token for ``caller``: 0.0 when granted, else seconds until one is there;
        ``inf`` when the caller is past its share while others ask: refused at once, its
        tasks do not wait (and hold the intake) for tokens that are the others'."""
        callers = self._callers(caller)
        bucket, share = self._bucket, self._share(caller, callers)
        if callers == 1:  # its share is the whole bucket: spent alike, it is as empty
            share.take()
            return bucket.take()
        if share.wait() == 0.0:  # within its share
            if (wait_s := bucket.take()) == 0.0:
                share.take()
            return wait_s
        # Past its share: only the tokens above what the others may need at once, kept a
        # token below the burst (else only a full bucket gave any: refills that came while
        # it was full were lost, a tenth of the rate with twelve callers, an outside trial).
        capacity = bucket.capacity
        room = 2.0 if capacity >= 3 else 1.0
        reserve = min(max(1.0, capacity * (callers - 1) / callers), capacity - room)
        if reserve >= 1.0 and bucket.take(need=1 + reserve) == 0.0:
            return 0.0
        return math.inf

    def refusal(self, topic: str, caller: str | None) -> tuple[str, int]:
        """Why a task of ``topic`` from ``caller`` was refused, and in how many ms it may be
        sent again."""
        rate, burst, callers = self._bucket.rate, self._bucket.capacity, len(self._asked)
        limit = f"{rate:g}/s, burst {burst:g}, per coordinator replica"
        share = self._shares.get(caller)
        if callers > 1 and share is not None and (wait_s := share.wait()) > 0:
            who = "the operators' bare subject" if caller is None else f"caller {caller!r}"
            why = (
                f"{who} is past its share of the rate of topic {topic!r} ({limit}): shared"
                f" by {callers} callers now, {rate / callers:.3g}/s each and what the others"
                " leave unused"
            )
        else:
            why, wait_s = f"topic {topic!r} is over its rate ({limit})", self._bucket.wait()
        return why, max(1, math.ceil(wait_s * 1000))

    def _callers(self, caller: str | None) -> int:
        """How many callers asked within ACTIVE_S, ``caller`` now (the others are forgotten,
        looked for at most every PRUNE_S: a flood under many names costs no scan per task)."""
        now = self._asked[caller] = self._clock()
        if now - self._pruned >= self.PRUNE_S:
            self._pruned = now
            for gone in [c for c, at in self._asked.items() if now - at > self.ACTIVE_S]:
                del self._asked[gone]
                self._shares.pop(gone, None)
        return len(self._asked)

    def _share(self, caller: str | None, callers: int) -> TokenBucket:
        """``caller``'s share: at least 2 tokens of burst, or a caller asking more often than
        its share refills would lose what came between (a third of it at 10/s, share 4.2/s);
        the topic's own bucket still bounds them all."""
        share = self._shares.get(caller)
        rate, burst = self._bucket.rate / callers, max(2.0, self._bucket.capacity / callers)
        if share is None:
            share = self._shares[caller] = TokenBucket(rate, burst, self._clock)
        share.wait()  # refilled at the rate it had until now
        share.rate, share.capacity = rate, burst
        return share


class RateLimiter:
    """Whether a topic or an agent may take one more task now (0.0), or in how long."""

    def __init__(self, config: RateLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._topics: dict[str, TopicBucket] = {}
        self._agents: dict[str, tuple[RateLimit, TokenBucket]] = {}
        self._unheard = UnheardRefusals("a topic's rate", clock)

    def topic_wait(self, topic: str, caller: str | None = None) -> float:
        """Take a token of ``topic`` for ``caller`` (None: an operator's bare subject): 0.0
        when granted, else seconds until one is there."""
        limit = self.config.topics.get(topic)
        if limit is None:
            return 0.0
        bucket = self._topics.get(topic)
        if bucket is None:
            bucket = self._topics[topic] = TopicBucket(limit, self._clock)
        return bucket.take(caller)

    def topic_refusal(self, task: Task) -> tuple[str, int, bool]:
        """Why :meth:`topic_wait` refused ``task``, in how many ms it may be sent again, and
        whether the refusal is dead-lettered (see :class:`UnheardRefusals`)."""
        why, retry_ms = self._topics[task.topic].refusal(task.topic, task.caller)
        return why, retry_ms, self._unheard.letter(task, self.config.topics[task.topic])

    def agent_wait(self, card: AgentCard, *, take: bool) -> float:
        """Seconds until ``card``'s agent may take a task (0.0: now); ``take`` spends the token."""
        limit = self.config.agents.get(card.agent_id) or card.rate_limit
        if limit is None:
            return 0.0
        known = self._agents.get(card.agent_id)
        if known is None or known[0] != limit:  # new, or its card changed the limit
            known = self._agents[card.agent_id] = (
                limit,
                TokenBucket(limit.rate, limit.burst, self._clock),
            )
        bucket = known[1]
        return bucket.take() if take else bucket.wait()


class UnheardRefusals:
    """Which refusals for a rate (a caller's quota, a topic's rate) are dead-lettered: those
    of a task without a reply address, whose caller would hear of the refusal from nobody
    (fire and forget, `reach publish`, `nats pub`); a caller that waits for a reply hears it,
    and sends again after ``retry_after_ms``. At most at the rate's own pace per caller and
    replica: a caller flooding far past it must not fill REACH_DLQ, whose room every other
    letter needs; the refusals past that pace are ``rejected`` events alone, and said once a
    minute."""

    def __init__(self, over: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._over = over  # what the callers flood past: "its quota", "a topic's rate"
        self._clock = clock
        self._letters: OrderedDict[str, TokenBucket] = OrderedDict()
        self._said = RepeatedLines(UNLETTERED_SAID_EVERY_S)

    def letter(self, task: Task, limit: RateLimit) -> bool:
        """Whether ``task``'s refusal is dead-lettered (its caller was over ``limit``)."""
        if task.reply_to is not None:
            return False
        caller = task.caller or ""  # the operators' bare subject: one pace for them all
        bucket = self._letters.get(caller)
        if bucket is None:
            bucket = self._letters[caller] = TokenBucket(limit.rate, limit.burst, self._clock)
            if len(self._letters) > KEPT_LETTER_PACES:
                self._letters.popitem(last=False)
        self._letters.move_to_end(caller)
        if bucket.take() == 0.0:
            return True
        if (times := self._said.due(caller)) is not None:
            log.warning(
                f"caller floods past {self._over} without a reply address: its refusals past"
                " that pace are rejected events only, not dead letters",
                caller=task.caller if task.caller is not None else "(the bare subject)",
                rate=limit.rate,
                since_last=times,
            )
        return False
