"""A CompensationWorker's set-up checks and its pace after a handler fails."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from agentreach.agents import CompensationWorker, compensation
from agentreach.agents.compensation import retry_delay_s
from agentreach.agents.errors import AgentConfigError
from agentreach.broker.consume import consumer_state
from agentreach.broker.dead_letters import dead_letter
from agentreach.envelopes import DeadLetter, Task, encode, now_ms
from tests.secured import SecuredDeployment, secured_server
from tests.support import eventually, until_true


async def _nothing(letter, comp) -> None:  # type: ignore[no-untyped-def]
    pass


def test_a_handler_that_keeps_failing_is_called_ever_less_often():
    assert [retry_delay_s(n) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]
    assert retry_delay_s(30) == 300  # at most every 5 minutes


def test_a_name_that_cannot_name_a_consumer_is_refused_at_once():
    """It failed only in running(), with nats-py's `invalid consumer name`."""
    with pytest.raises(AgentConfigError, match=r"worker name 'bad name\.x'"):
        CompensationWorker("bad name.x", _nothing)


def test_a_reason_the_coordinator_never_gives_is_said():
    """`circuit_open` is an error type (its letters are `rejected`): a worker filtered on it
    would wait for ever, without a word."""
    with capture_logs() as logs:
        CompensationWorker("w", _nothing, reasons=["circuit_open", "expired"])
    said = [line for line in logs if line.get("reason") == "circuit_open"]
    assert len(said) == 1 and said[0]["log_level"] == "warning"
    assert not [line for line in logs if line.get("reason") == "expired"]


async def test_a_worker_s_consumer_unused_past_the_letters_keeping_goes_by_itself(
    broker, monkeypatch: pytest.MonkeyPatch
):
    """A worker run once under a name of its own left its durable consumer for good; unused
    for longer than letters are kept (here 1 s), the server removes it."""
    monkeypatch.setattr(compensation, "FORGOTTEN_AFTER_S", 1.0)
    durable = "compensation-one-off"

    async def nothing(comp, letter) -> None:
        return None

    async with CompensationWorker("one-off", nothing).running(broker=broker):
        state = await consumer_state(broker, broker.names.dlq_stream, durable)
        assert state is not None and state.spec.inactive_threshold_s == 1.0

    async def gone() -> bool:
        return await consumer_state(broker, broker.names.dlq_stream, durable) is None

    assert await until_true(gone, timeout=15)


@pytest.mark.parametrize("asked", [b"", b'{"no_hdr": true}'], ids=["headers", "no_hdr"])
async def test_a_letter_the_server_wrote_is_handed_to_no_handler(broker, asked: bytes):
    """An agent wrote a dead letter of its choosing under a key of its own and had the server
    copy it onto `reach.dlq.rejected.chores` (a direct get with its reply aimed there): a
    worker replayed its payload (refund_to mallory) in its own name. It is no letter; nor
    is one copied with no headers at all (`no_hdr`), where the coordinator's carry some."""
    handled: list[str] = []

    async def record(letter, comp) -> None:  # type: ignore[no-untyped-def]
        handled.append(letter.message_id)

    task = Task(v=1, message_id="forged-1", trace_id="forged-1", topic="chores")
    forged = DeadLetter(
        v=1, reason="rejected", message_id="forged-1", trace_id="forged-1", topic="chores",
        envelope=task, at_ms=now_ms(),
    )  # fmt: skip
    own = f"$KV.{broker.names.executions_bucket}.x.t.mallory"
    await broker.publish(own, encode(forged))
    stream = f"KV_{broker.names.executions_bucket}"
    target = broker.names.dlq("rejected", "chores")
    await broker.nc.publish(f"$JS.API.DIRECT.GET.{stream}.{own}", asked, reply=target)
    real = Task(v=1, message_id="real-1", trace_id="real-1", topic="chores")
    with capture_logs() as logs:
        async with CompensationWorker("w-forged", record, topics=["chores"]).running(broker=broker):
            await dead_letter(
                broker, reason="rejected", task=real, message_id="real-1", trace_id="real-1",
                topic="chores",
            )  # fmt: skip
            await until_true(lambda: _handled(handled, "real-1"))
    assert handled == ["real-1"]
    assert any("not a dead letter" in str(line.get("error", "")) for line in logs)


async def _handled(handled: list[str], message_id: str) -> bool:
    return message_id in handled


async def test_a_worker_named_otherwise_than_its_creds_is_told_so_at_once(tmp_path):
    """A worker's creds let it use the consumer of its own name only: with another name it
    waited "for JetStream: the cluster may be electing a leader" for ever (a trial)."""
    deployment = SecuredDeployment(tmp_path / "auth")
    async with secured_server(deployment, tmp_path / "server") as server:
        worker = CompensationWorker("other", _nothing)
        with pytest.raises(AgentConfigError) as refused:
            async with worker.running(server.url, auth=deployment.auth("worker", "fixer")):
                pass
    assert str(refused.value).startswith(
        "the creds are for worker 'fixer', but this worker is 'other'"
    )


async def test_a_handler_that_runs_on_is_said_while_the_worker_waits_for_it(
    broker, monkeypatch: pytest.MonkeyPatch
):
    """Letters are handled one at a time: a hung handler stopped its worker without a word
    (a trial). Every STILL_RUNNING_S (here 0.1 s) it is said, naming the letter."""
    monkeypatch.setattr(compensation, "STILL_RUNNING_S", 0.1)
    release = asyncio.Event()
    handled: list[str] = []

    async def slow(letter, comp) -> None:  # type: ignore[no-untyped-def]
        await release.wait()
        handled.append(letter.message_id)

    task = Task(v=1, message_id="slow-1", trace_id="slow-1", topic="chores")
    with capture_logs() as logs:
        async with CompensationWorker("w-slow", slow, topics=["chores"]).running(broker=broker):
            await dead_letter(
                broker, reason="rejected", task=task, message_id="slow-1", trace_id="slow-1",
                topic="chores",
            )  # fmt: skip

            def said() -> bool:
                return any(line["event"].startswith("compensation handler still") for line in logs)

            await eventually(said)
            release.set()
            await until_true(lambda: _handled(handled, "slow-1"))
    line = next(line for line in logs if line["event"].startswith("compensation handler still"))
    assert line["message_id"] == "slow-1" and line["running_s"] >= 0.1


async def test_a_handler_past_its_timeout_is_cancelled_and_its_letter_comes_back(
    broker, monkeypatch: pytest.MonkeyPatch
):
    """A hung handler held its worker for good: with `handler_timeout_s` (here 0.3 s) it is
    cancelled, said, and the letter handed over again later, as after a failure."""
    monkeypatch.setattr(compensation, "RETRY_DELAY_S", 0.1)
    calls: list[str] = []
    cleaned_up: list[str] = []
    handled: list[str] = []

    async def hangs_once(letter, comp) -> None:  # type: ignore[no-untyped-def]
        calls.append(letter.message_id)
        if len(calls) == 1:
            try:
                await asyncio.Event().wait()  # never set: the first call hangs
            finally:
                cleaned_up.append(letter.message_id)
        handled.append(letter.message_id)

    task = Task(v=1, message_id="hung-1", trace_id="hung-1", topic="chores")
    worker = CompensationWorker("w-hung", hangs_once, topics=["chores"], handler_timeout_s=0.3)
    with capture_logs() as logs:
        async with worker.running(broker=broker):
            await _rejected(broker, task)
            await until_true(lambda: _handled(handled, "hung-1"))
    assert calls == ["hung-1", "hung-1"] and cleaned_up == ["hung-1"]
    [timed_out] = [line for line in logs if line["event"].startswith("compensation handler timed")]
    assert timed_out["message_id"] == "hung-1" and timed_out["timeout_s"] == 0.3
    assert timed_out["log_level"] == "error"


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), "5", True])
def test_a_handler_timeout_that_is_no_duration_is_refused(timeout):
    with pytest.raises(AgentConfigError, match=r"handler_timeout_s=.*expected seconds > 0"):
        CompensationWorker("w", _nothing, handler_timeout_s=timeout)


async def test_a_handler_that_swallows_its_cancellation_keeps_its_letter_until_it_ends(
    broker, monkeypatch: pytest.MonkeyPatch
):
    """Cancelled at its timeout, a handler went on, and its letter was handed over again
    meanwhile: a refund made twice (a review). The letter is held until the call ends; one
    that then returns dealt with it, and it is not handed over again."""
    monkeypatch.setattr(compensation, "STILL_RUNNING_S", 0.1)
    monkeypatch.setattr(compensation, "RETRY_DELAY_S", 0.1)
    calls: list[str] = []
    refunded = asyncio.Event()

    async def stubborn(letter, comp) -> None:  # type: ignore[no-untyped-def]
        calls.append(letter.message_id)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # goes on: the refund is made regardless
        refunded.set()

    task = Task(v=1, message_id="refund-1", trace_id="refund-1", topic="chores")
    worker = CompensationWorker("w-stubborn", stubborn, topics=["chores"], handler_timeout_s=0.2)
    with capture_logs() as logs:
        async with worker.running(broker=broker):
            await _rejected(broker, task)
            await asyncio.wait_for(refunded.wait(), timeout=10)

            async def settled() -> bool:
                durable = "compensation-w-stubborn"
                state = await consumer_state(broker, broker.names.dlq_stream, durable)
                return state is not None and state.num_ack_pending == state.num_pending == 0

            await until_true(settled, timeout=10)
    assert calls == ["refund-1"]  # not handed over while it ran, nor after it returned
    held = [line for line in logs if line["event"].startswith("compensation handler goes on")]
    assert held and held[0]["log_level"] == "error" and held[0]["message_id"] == "refund-1"
    # Said at the timeout too: one that went on for less than a minute left no line (a re-trial).
    [cancelling] = [line for line in logs if line["event"].startswith("compensation handler ran")]
    assert cancelling["message_id"] == "refund-1" and cancelling["timeout_s"] == 0.2


async def _rejected(broker, task: Task) -> None:  # type: ignore[no-untyped-def]
    """``task``'s dead letter, as the coordinator writes one for a rejected task."""
    await dead_letter(
        broker, reason="rejected", task=task, message_id=task.message_id,
        trace_id=task.trace_id, topic=task.topic,
    )  # fmt: skip
