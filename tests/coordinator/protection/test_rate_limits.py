"""A topic's token bucket shared by its callers: a caller over the topic's rate keeps no
other caller out, and the rate nobody else wants still goes to whoever asks."""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable

import pytest

from agentreach.coordinator import RateLimits
from agentreach.coordinator.protection.rate_limits import RateLimiter, TopicBucket
from agentreach.envelopes import RateLimit

TOPIC = RateLimit(rate=50, burst=10)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def admitted(
    paces: dict[str | None, float],
    seconds: float,
    limit: RateLimit = TOPIC,
    *,
    named: Callable[[str | None], str | None] = lambda caller: caller,
    wait_s: float = 0.1,
) -> tuple[Counter[str | None], Counter[str | None]]:
    """Each caller asks at its pace (tasks a second, evenly spaced, out of step with the
    others) for ``seconds``, under the name ``named`` gives it; a task waits as the intake
    does (for the token, within ``wait_s``). (admitted, refused) per caller."""
    clock = Clock()
    limiter = RateLimiter(RateLimits(topics={"t": limit}, wait_s=wait_s), clock)
    asks = [
        ((n + k / len(paces)) / pace, n * len(paces) + k, caller, 0.0)
        for k, (caller, pace) in enumerate(paces.items())
        for n in range(int(seconds * pace))
    ]
    heapq.heapify(asks)
    granted, refused = Counter[str | None](), Counter[str | None]()
    while asks:
        at, order, caller, waited_s = heapq.heappop(asks)
        clock.now = at
        wait_s = limiter.topic_wait("t", named(caller))
        if wait_s == 0.0:
            granted[caller] += 1
        elif waited_s + wait_s > limiter.config.wait_s:
            refused[caller] += 1
        else:
            wait_s = max(wait_s, 0.001)  # the intake's sleep takes at least a while too
            heapq.heappush(asks, (at + wait_s, order, caller, waited_s + wait_s))
    return granted, refused


def test_a_caller_alone_may_take_the_topics_whole_rate():
    granted, _ = admitted({"heavy": 90}, seconds=10)
    assert granted["heavy"] == pytest.approx(50 * 10 + 10, abs=6)  # the rate and the burst


def test_a_caller_over_the_rate_keeps_no_other_caller_out():
    """The security re-test's shape: 90 tasks/s against a topic's 50/s, another caller's
    20/s beside it. A plain bucket refused about half of the second caller's."""
    granted, refused = admitted({"heavy": 90, "light": 20}, seconds=10)
    assert refused["light"] == 0
    assert granted["light"] == 200
    assert granted["heavy"] + granted["light"] == pytest.approx(510, abs=10)  # all the rate used


def test_one_bucket_for_everyone_refused_the_second_caller():
    """The same shape through one bucket for everyone, as before the shares."""
    paces = {"heavy": 90.0, "light": 20.0}
    _, refused = admitted(paces, 10, named=lambda _: "everyone", wait_s=0)
    assert refused["light"] > 50
    _, refused = admitted(paces, 10, wait_s=0)  # a name each: the same without waiting
    assert refused["light"] == 0


def test_callers_over_the_rate_share_it_equally():
    granted, _ = admitted({"a": 90, "b": 90}, seconds=10)
    assert granted["a"] == pytest.approx(granted["b"], rel=0.1)
    assert granted["a"] + granted["b"] == pytest.approx(510, abs=10)


def test_the_rate_another_caller_leaves_goes_to_whoever_asks():
    """40/s and 5/s against 50/s: both fit, though 40 is over an equal share (25/s)."""
    _, refused = admitted({"a": 40, "b": 5}, seconds=10)
    assert refused == Counter()


def test_more_callers_than_the_burst_still_leave_their_unused_rate_to_others():
    """An outside trial: twelve callers at 0.7/s beside one at 90/s, burst 10. The reserve
    was the burst's part of the eleven others, more than the burst: the heavy caller was
    held to its share, and the topic admitted 12.7/s of its 50/s."""
    paces: dict[str | None, float] = {f"light-{n}": 0.7 for n in range(12)}
    granted, refused = admitted({**paces, "heavy": 90}, seconds=20)
    assert sum(refused[c] for c in paces) == 0
    # All the rate used: the heavy caller took only from a full bucket, and what came while
    # it was full was lost (45/s of 50/s, a later trial).
    assert sum(granted.values()) == pytest.approx(50 * 20 + 10, abs=15)


def test_many_callers_over_their_shares_use_the_whole_rate_equally():
    """A trial's twelve callers at 10/s against 50/s: each share (4.2/s) had a burst of one
    token, which a caller asking every 0.1 s took every third ask (3.3/s); the topic admitted
    44-48/s, some callers half again as much as others."""
    granted, _ = admitted({f"c{n}": 10 for n in range(12)}, seconds=20)
    assert sum(granted.values()) == pytest.approx(50 * 20 + 10, abs=15)
    assert max(granted.values()) <= 1.1 * min(granted.values())


def test_an_operators_bare_subject_is_one_caller_among_the_others():
    granted, refused = admitted({"heavy": 90, None: 10}, seconds=10)
    assert refused[None] == 0 and granted[None] == 100


def test_a_caller_that_stopped_asking_is_forgotten():
    """Two seconds after its last ask a caller no longer takes a share: the one left has the
    whole rate again."""
    clock = Clock()
    bucket = TopicBucket(TOPIC, clock)
    for n in range(200):  # both for 4 s, then only "a" for 4 s
        clock.now = n / 50
        bucket.take("a")
        if clock.now < 4:
            bucket.take("b")
    clock.now = 6.5
    assert bucket._callers("a") == 1
    took = 0
    for n in range(100):  # "a" alone at 100/s for 1 s
        clock.now = 6.5 + n / 100
        took += bucket.take("a") == 0.0
    assert took == pytest.approx(50 + 10, abs=2)


def test_a_burst_too_small_for_a_reserve_still_shares():
    """With a burst of 1 no token can be kept back: each caller has its share and no more."""
    granted, refused = admitted({"a": 90, "b": 20}, seconds=10, limit=RateLimit(rate=50, burst=1))
    assert refused["b"] <= 5  # with one token, the two sometimes want it at once
    assert 0 < granted["a"] <= 25 * 10 + 1  # its share at most


def test_a_refusal_says_the_rate_or_the_share_and_when_to_send_again():
    clock = Clock()
    bucket = TopicBucket(RateLimit(rate=20, burst=4), clock)
    for _ in range(4):
        assert bucket.take("a") == 0.0
    assert bucket.take("a") == pytest.approx(0.05)
    assert bucket.refusal("t", "a") == (
        "topic 't' is over its rate (20/s, burst 4, per coordinator replica)",
        50,
    )
    assert bucket.take("b") == pytest.approx(0.05)  # within its share: the topic is empty
    assert bucket.take("a") == math.inf  # past its share while "b" asks: refused at once
    assert bucket.refusal("t", "a") == (
        "caller 'a' is past its share of the rate of topic 't' (20/s, burst 4, per"
        " coordinator replica): shared by 2 callers now, 10/s each and what the others leave"
        " unused",
        100,
    )
    for caller in "cdefghijkl":  # twelve: a share's rate said as people read it
        bucket.take(caller)
    assert "shared by 12 callers now, 1.67/s each" in bucket.refusal("t", "a")[0]
