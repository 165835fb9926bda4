"""Waiting for JetStream to answer at a start: what counts as "no answer", one warning per
try, and a command's patience that ends in one line saying why."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest
from nats.js import api
from structlog.testing import capture_logs

from agentreach.broker import BrokerTimeout, ProvisionError, StreamNotFound, Unavailable, failover
from agentreach.broker.failover import unanswered, until_answered


def api_error(code: int, err_code: int, description: str) -> nats.js.errors.APIError:
    """The error nats-py raises for this answer of the JetStream API."""
    try:
        nats.js.errors.APIError.from_error(
            {"code": code, "err_code": err_code, "description": description}
        )
    except nats.js.errors.APIError as raised:
        return raised
    raise AssertionError("from_error raises")


def test_what_counts_as_no_answer():
    """Timeouts, no responders and 503s (no leader, or no meta leader: 10008, also behind a
    ProvisionError it caused) are waited for; JetStream disabled and a refusal are not."""
    lost_majority = api_error(503, 10008, "JetStream system temporarily unavailable")
    probe_refused = ProvisionError("cannot tell the cluster's size")
    probe_refused.__cause__ = lost_majority
    for exc in (
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
        lost_majority,
        probe_refused,
        BrokerTimeout("timed out"),
        Unavailable("JetStream unavailable (503)", err_code=10008),
    ):
        assert unanswered(exc), exc
    for exc in (
        api_error(503, 10039, "jetstream not enabled for account"),
        api_error(400, 10005, "insufficient resources"),
        StreamNotFound("stream not found", err_code=10059),
        ProvisionError("cannot provision"),
    ):
        assert not unanswered(exc), exc


async def test_it_asks_again_saying_each_time_what_it_waits_for(monkeypatch):
    """Each failed try is one warning naming what is waited for, then the answer is returned."""
    monkeypatch.setattr(failover, "backoff_s", lambda tries: 0.01)
    answers = iter([nats.errors.TimeoutError(), api_error(503, 10008, "unavailable"), "ok"])

    async def ask() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with capture_logs() as logs:
        assert await until_answered(ask, waiting_for="consumer c of stream S") == "ok"
    assert [line["waiting_for"] for line in logs] == ["consumer c of stream S"] * 2
    assert all(line["log_level"] == "warning" for line in logs)
    assert "may be electing a leader" in logs[0]["event"]


async def test_a_command_gives_up_after_its_patience_saying_why(monkeypatch):
    """With a patience, the wait ends in Unavailable naming what did not answer and saying
    the cluster may be electing a leader or have most of its nodes down."""
    monkeypatch.setattr(failover, "backoff_s", lambda tries: 0.05)

    async def never() -> None:
        raise nats.errors.TimeoutError

    with pytest.raises(Unavailable) as raised:
        await until_answered(never, waiting_for="the list of streams", patience_s=0.2)
    said = str(raised.value)
    assert "JetStream did not answer for the list of streams within 0.2 s" in said
    assert "the cluster may be electing a leader, or most of its nodes may be down" in said


async def test_another_failure_is_raised_at_once():
    """A refusal is not waited for."""
    tries = 0

    async def refused() -> None:
        nonlocal tries
        tries += 1
        raise api_error(400, 10005, "insufficient resources")

    with pytest.raises(nats.js.errors.APIError):
        await until_answered(refused, waiting_for="x")
    assert tries == 1


async def test_a_write_whose_id_is_being_stored_is_made_again(broker):
    """Across an election a write made again finds its first try still being stored: nats-
    server says "duplicate message id is in process" (10158), and a caller got that raw
    JetStreamError (466 times in a cluster walkthrough). Asked again, it is stored (or said
    a duplicate); without a Nats-Msg-Id, where that cannot be, it is raised."""
    tries: list[int] = []

    async def write() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise api_error(409, 10158, "duplicate message id is in process")
        return "stored"

    subject = broker.names.task("echo")
    stored = await failover.through_elections(write, broker, subject=subject, retry_timeouts=True)
    assert (stored, len(tries)) == ("stored", 2)
    tries.clear()
    with pytest.raises(Exception, match="in process"):
        await failover.through_elections(write, broker, subject=subject, retry_timeouts=False)


async def test_a_command_waits_its_whole_patience_before_giving_up(monkeypatch):
    """`reach provision` said "within 30 s" and gave up after 15 s: the next pause would have
    passed the deadline. The last pause is cut to the deadline, and tried once more there."""
    monkeypatch.setattr(failover, "backoff_s", lambda tries: 10.0)
    tries: list[float] = []
    loop = asyncio.get_running_loop()

    async def never() -> None:
        tries.append(loop.time())
        raise nats.errors.TimeoutError

    started = loop.time()
    with pytest.raises(Unavailable):
        await until_answered(never, waiting_for="the list of streams", patience_s=0.3)
    assert len(tries) == 2 and tries[-1] - started >= 0.29


async def test_a_write_made_again_is_not_told_a_duplicate_of_its_own_first_try(broker):
    """A try that timed out may have been stored: made again under its Nats-Msg-Id, the
    stream answers "duplicate". That is this write's own copy, not an earlier message: a
    client took its task for one sent before, and warned that it was not taken in."""
    tries: list[int] = []

    async def write() -> api.PubAck:
        tries.append(1)
        if len(tries) == 1:
            raise nats.errors.TimeoutError
        return api.PubAck(stream="REACH_TASKS", seq=7, duplicate=True)

    subject = broker.names.task("echo")
    stored = await failover.through_elections(write, broker, subject=subject, retry_timeouts=True)
    assert (stored.seq, stored.duplicate, len(tries)) == (7, None, 2)

    async def at_once() -> api.PubAck:
        return api.PubAck(stream="REACH_TASKS", seq=7, duplicate=True)

    first = await failover.through_elections(at_once, broker, subject=subject, retry_timeouts=True)
    assert first.duplicate  # an earlier message's, sent before this write
