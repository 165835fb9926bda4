"""One reply subscription per connection, each answer handed to its own asker."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from agentreach.broker.reply_inbox import ReplyInbox


async def test_answers_reach_their_asker_on_one_subscription(broker):
    """Two first askers at once share one subscription; each gets only its own answers,
    and a forgotten token gets nothing."""
    inbox = ReplyInbox(broker)
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    both = asyncio.Event()

    def handler(name: str):  # type: ignore[no-untyped-def]
        def take(msg) -> None:  # type: ignore[no-untyped-def]
            got[name].append(msg.data)
            if got["a"] and got["b"]:
                both.set()

        return take

    (_, reply_a), (_, reply_b) = await asyncio.gather(
        inbox.expect(handler("a")), inbox.expect(handler("b"))
    )
    assert reply_a.rsplit(".", 1)[0] == reply_b.rsplit(".", 1)[0]  # one subscription
    token_c, reply_c = await inbox.expect(handler("a"))
    inbox.forget(token_c)
    for reply, data in ((reply_c, b"forgotten"), (reply_a, b"to a"), (reply_b, b"to b")):
        await broker.nc.publish(reply, data)
    async with asyncio.timeout(5):
        await both.wait()
    assert got == {"a": [b"to a"], "b": [b"to b"]}


async def test_ask_returns_the_one_answer_and_says_when_nobody_listens(broker):
    """``ask`` gets the responder's answer on the shared inbox; with no responder it raises
    nats-py's NoRespondersError at once, and with a silent listener its timeout."""
    inbox = broker.shared(ReplyInbox)

    async def echo(msg) -> None:  # type: ignore[no-untyped-def]
        await msg.respond(b"echo " + msg.data)

    answering = await broker.nc.subscribe("inbox.ask.echo", cb=echo)
    silent = await broker.nc.subscribe("inbox.ask.silent")
    answer = await inbox.ask("inbox.ask.echo", b"hi", timeout_s=5)
    assert answer.data == b"echo hi"
    with pytest.raises(nats.errors.NoRespondersError):
        await inbox.ask("inbox.ask.nobody", b"hi", timeout_s=5)
    with pytest.raises(TimeoutError):
        await inbox.ask("inbox.ask.silent", b"hi", timeout_s=0.2)
    await answering.unsubscribe()
    await silent.unsubscribe()
