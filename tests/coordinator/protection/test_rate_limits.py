"""A topic's token bucket shared by its callers: a caller over the topic's rate keeps no
other caller out, and the rate nobody else wants still goes to whoever asks."""

from __future__ import annotations

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
) -> tuple[Counter[str | None], Counter[str | None]]:
    """Each caller asks at its pace (tasks a second, evenly spaced) for ``seconds``, under the
    name ``named`` gives it, and takes no for an answer (the intake's ``wait_s`` of 0):
    (admitted, refused) per caller."""
    clock = Clock()
    limiter = RateLimiter(RateLimits(topics={"t": limit}), clock)
    asks = [
        (n / pace, caller) for caller, pace in paces.items() for n in range(int(seconds * pace))
    ]
    granted, refused = Counter[str | None](), Counter[str | None]()
    for at, caller in sorted(asks, key=lambda ask: ask[0]):
        clock.now = at
        if limiter.topic_wait("t", named(caller)) == 0.0:
            granted[caller] += 1
        else:
            refused[caller] += 1
    return granted, refused


def test_a_caller_alone_may_take_the_topics_whole_rate():
    granted, _ = admitted({"heavy": 90}, seconds=10)
    assert granted["heavy"] == pytest.approx(50 * 10 + 10, abs=2)  # the rate and the burst


def test_a_caller_over_the_rate_keeps_no_other_caller_out():
    """The security re-test's shape: 90 tasks/s against a topic's 50/s, another caller's
    20/s beside it. A plain bucket refused about half of the second caller's."""
    granted, refused = admitted({"heavy": 90, "light": 20}, seconds=10)
    assert refused["light"] == 0
    assert granted["light"] == 200
    assert granted["heavy"] + granted["light"] == pytest.approx(510, abs=10)  # all the rate used


def test_one_bucket_for_everyone_refused_the_second_caller():
    """The same shape through one bucket for everyone, as before the shares."""
    _, refused = admitted({"heavy": 90, "light": 20}, seconds=10, named=lambda _: "everyone")
    assert refused["light"] > 50


def test_callers_over_the_rate_share_it_equally():
    granted, _ = admitted({"a": 90, "b": 90}, seconds=10)
    assert granted["a"] == pytest.approx(granted["b"], rel=0.1)
    assert granted["a"] + granted["b"] == pytest.approx(510, abs=10)


def test_the_rate_another_caller_leaves_goes_to_whoever_asks():
    """40/s and 5/s against 50/s: both fit, though 40 is over an equal share (25/s)."""
    _, refused = admitted({"a": 40, "b": 5}, seconds=10)
    assert refused == Counter()


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


def test_a_refusal_says_the_rate_and_the_share():
    clock = Clock()
    bucket = TopicBucket(RateLimit(rate=20, burst=4), clock)
    assert bucket.take("a") == 0.0
    assert bucket.refusal("t") == "topic 't' is over its rate (20/s, burst 4)"
    bucket.take("b")
    assert bucket.refusal("t") == (
        "topic 't' is over its rate (20/s, burst 4), shared by 2 callers now: 10/s each"
    )
