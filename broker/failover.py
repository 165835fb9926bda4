"""Riding out a JetStream leader election.

When the node leading a replicated stream dies, the other replicas elect a new leader within
seconds (3.5-8.6 s after a kill -9 here: the Raft election timeout, randomised, not tunable
from a client). Until then a write to the stream finds nobody to answer (503, no responders),
and nats-py raises ``NoStreamResponseError``: the very answer it gives for a stream that does
not exist. The meta leader knows which streams exist, so one question to it tells "being
elected" (wait, and write again) from "not provisioned" (say so at once).

A write that found no responder was not stored, so writing it again is always safe. A write
that timed out may have been stored; it is written again only when it carries a
``Nats-Msg-Id``, which makes the stream drop the second copy. A timeout may also mean that
no stream exists and a plain subscriber holds the subject: the meta leader says so too.

A process's start (provisioning, creating its consumers, looking for the streams) meets the
same silence when it starts during an election, or while most of the nodes are down (no
meta leader: every API request is refused as "temporarily unavailable", 10008). There is
no write to make again, only a question to ask again: :func:`until_answered` asks it after
1, 2, 4 … s (capped at 30 s, jittered), one line each time saying what it waits for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import nats.errors
import nats.js.errors
from nats.js import api

from agentreach.broker.errors import (
    BrokerError,
    BrokerTimeout,
    JetStreamError,
    NoResponders,
    NoStreamError,
    Unavailable,
    honour_cancellation,
    translate,
)
from agentreach.logs import get_logger

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

log = get_logger("broker.failover")

T = TypeVar("T")

ELECTION_BUDGET_S = 15.0  # above the slowest election seen (8.6 s), with room for a reconnect
RETRY_FIRST_S = 0.1
RETRY_CAP_S = 1.0
META_TIMEOUT_S = 2.0
_UNANSWERED = (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError, TimeoutError)
WAIT_FIRST_S = 1.0
WAIT_CAP_S = 30.0
JS_UNAVAILABLE = 10008  # "JetStream system temporarily unavailable": no meta leader
JS_NOT_ENABLED = (10039, 10076)  # 503 too, but for good: waiting would not help
# "duplicate message id is in process": a write of the same Nats-Msg-Id is being stored now
# (one made again across an election); asked again, it is stored, or said a duplicate.
DUPLICATE_IN_PROCESS = 10158
ELECTING = "the cluster may be electing a leader, or most of its nodes may be down"
_NO_ANSWER = (
    nats.errors.TimeoutError,
    TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
    BrokerTimeout,
    NoResponders,
    Unavailable,
)
_CODED = (nats.js.errors.APIError, JetStreamError)


async def through_elections(
    write: Callable[[], Awaitable[T]],
    broker: Broker,
    *,
    subject: str,
    retry_timeouts: bool,
    budget_s: float | None = None,
) -> T:
    """``await write()``, again while the stream on ``subject`` has no leader, for at most
    ``budget_s`` (the broker's ``election_budget_s`` by default).

    Raises :class:`~agentreach.broker.errors.NoStreamError` at once when no stream listens
    on ``subject``, :class:`~agentreach.broker.errors.Unavailable` when the budget ran out,
    and any other failure translated, at once.
    """
    loop = asyncio.get_running_loop()
    budget = broker.election_budget_s if budget_s is None else budget_s
    deadline = loop.time() + budget
    delay = RETRY_FIRST_S
    listens: bool | None = None
    tried = False
    while True:
        try:
            return _own_copy(await write()) if tried else await write()
        except _UNANSWERED as exc:
            # A timeout may mean no stream too: a plain subscriber on the subject (`nats sub`)
            # answers nothing where a missing stream would have said so.
            if listens is None:
                listens = await stream_listens(broker, subject)
            if listens is False:
                raise _no_stream(subject) from exc
            if not retry_timeouts and not isinstance(exc, nats.js.errors.NoStreamResponseError):
                raise translate(exc, subject=subject) from exc
            failure: Exception = exc
        except nats.js.errors.APIError as exc:
            if exc.err_code != DUPLICATE_IN_PROCESS or not retry_timeouts:
                raise translate(exc, subject=subject) from exc
            failure = exc
        except nats.errors.Error as exc:
            raise translate(exc, subject=subject) from exc
        honour_cancellation()
        tried = True
        if loop.time() + delay > deadline:
            why = (
                "a leader election that does not end: are most of the cluster's nodes down?"
                if broker.connected
                else "the connection to the server is down, and coming back"
            )
            raise Unavailable(
                f"no stream leader took the write on {subject!r} within {budget:g} s ({why})"
            ) from failure
        log.debug("no stream leader yet; writing again", subject=subject, retry_in_s=delay)
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(RETRY_CAP_S, delay * 2)


def _own_copy(answer: T) -> T:
    """A write made again after an unanswered try: a "duplicate" is that try, stored after
    all, not an earlier message under the same id (its writer took it for sent before)."""
    if isinstance(answer, api.PubAck) and answer.duplicate:
        return dataclasses.replace(answer, duplicate=None)  # type: ignore[return-value]
    return answer


def unanswered(exc: BaseException | None) -> bool:
    """Whether ``exc``, or what caused it, says that JetStream could not answer now: a
    timeout, nobody listening on the API, or a 503 (no leader yet; "temporarily
    unavailable", 10008, for a lost majority). Not JetStream disabled, also a 503."""
    while exc is not None:
        code = exc.err_code if isinstance(exc, _CODED) else None
        if code in JS_NOT_ENABLED:
            return False
        if isinstance(exc, _NO_ANSWER) or code == JS_UNAVAILABLE:
            return True
        exc = exc.__cause__
    return False


def backoff_s(tries: int) -> float:
    """The pause after ``tries`` failed tries of a wait: 1, 2, 4 … s, capped at 30 s, then
    ± 20 % so that a fleet does not retry in step."""
    return min(WAIT_CAP_S, WAIT_FIRST_S * 2**tries) * random.uniform(0.8, 1.2)


async def until_answered(
    call: Callable[[], Awaitable[T]], *, waiting_for: str, patience_s: float | None = None
) -> T:
    """``await call()``, again while JetStream cannot answer it (see :func:`unanswered`),
    after :func:`backoff_s`, with one warning per try naming ``waiting_for``: for ever (a
    service's start: nothing exits), or for ``patience_s`` (a command), then
    :class:`~agentreach.broker.errors.Unavailable` saying why it may be. Any other failure
    is raised at once."""
    loop = asyncio.get_running_loop()
    deadline = None if patience_s is None else loop.time() + patience_s
    tries = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            if not unanswered(exc):
                raise
            failure = exc
        honour_cancellation()
        wait_s = backoff_s(tries)
        tries += 1
        if deadline is not None:  # a last try at the deadline: patience is what was said
            wait_s = min(wait_s, deadline - loop.time())
        if deadline is not None and wait_s <= 0:
            raise Unavailable(
                f"JetStream did not answer for {waiting_for} within {patience_s:g} s"
                f" ({_said(failure)}): {ELECTING}",
                err_code=JS_UNAVAILABLE,
            ) from failure
        log.warning(
            f"waiting for JetStream: {ELECTING}",
            waiting_for=waiting_for,
            error=_said(failure),
            retry_in_s=round(wait_s, 1),
        )
        await asyncio.sleep(wait_s)


def _said(exc: BaseException) -> str:
    return str(translate(exc)) if not isinstance(exc, BrokerError) else str(exc)


def _no_stream(subject: str) -> NoStreamError:
    return NoStreamError(
        f"no stream answered on {subject!r}: the streams are not provisioned"
        " (`reach provision`, or start the coordinator)"
    )


async def stream_listens(broker: Broker, subject: str) -> bool | None:
    """Whether a stream captures ``subject``; None when the meta leader does not answer
    (it is being elected too): then nobody can tell, and the caller waits."""
    try:
        return bool(await stream_names(broker, subject=subject))
    except BrokerError:
        return None


async def stream_names(broker: Broker, *, subject: str | None = None) -> list[str]:
    """Every stream's name (capturing ``subject``, when given), from the meta leader.

    Raises a BrokerError; when JetStream does not answer, one that names the stream looked
    for and says why that may be (an operator's command fails with it).
    """
    try:
        return await _stream_names(broker, subject)
    except (nats.errors.Error, TimeoutError) as exc:
        if not unanswered(exc):
            raise translate(exc, subject="$JS.API.STREAM.NAMES") from exc
        error = translate(exc)
        how = error.description if isinstance(error, JetStreamError) else str(error)
        said = f"no answer from JetStream about {_looked_for(subject)}: {how}; {ELECTING}"
        if isinstance(error, JetStreamError):
            raise Unavailable(said, err_code=error.err_code) from exc
        raise type(error)(said) from exc


def _looked_for(subject: str | None) -> str:
    """What a listing of the streams was for, in words."""
    if subject is None:
        return "which streams exist"
    if subject.startswith("$KV.") and subject.endswith(".>"):
        bucket = subject.removeprefix("$KV.").removesuffix(".>")
        return f"the stream KV_{bucket} (KV bucket {bucket})"
    return f"the stream of {subject!r}"


async def _stream_names(broker: Broker, subject: str | None) -> list[str]:
    names: list[str] = []
    while True:
        request: dict[str, object] = {"offset": len(names)}
        if subject is not None:
            request["subject"] = subject
        answer = await broker.nc.request(
            "$JS.API.STREAM.NAMES",
            json.dumps(request).encode(),
            timeout=META_TIMEOUT_S,
        )
        page = json.loads(answer.data)
        if "error" in page:
            raise nats.js.errors.APIError.from_error(page["error"])
        names += page.get("streams") or []
        if not page.get("streams") or len(names) >= page.get("total", 0):
            return names
