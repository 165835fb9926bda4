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
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import nats.errors
import nats.js.errors
import structlog

from agentreach.broker.errors import NoStreamError, Unavailable, honour_cancellation, translate

if TYPE_CHECKING:
    from agentreach.broker.connection import Broker

log = structlog.get_logger("broker.failover")

T = TypeVar("T")

ELECTION_BUDGET_S = 15.0  # above the slowest election seen (8.6 s), with room for a reconnect
RETRY_FIRST_S = 0.1
RETRY_CAP_S = 1.0
META_TIMEOUT_S = 2.0
_UNANSWERED = (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError, TimeoutError)


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
    while True:
        try:
            return await write()
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
        except nats.errors.Error as exc:
            raise translate(exc, subject=subject) from exc
        honour_cancellation()
        if loop.time() + delay > deadline:
            raise Unavailable(
                f"no stream leader took the write on {subject!r} within {budget:g} s"
                " (a leader election that does not end: are most of the cluster's nodes down?)"
            ) from failure
        log.debug("no stream leader yet; writing again", subject=subject, retry_in_s=delay)
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(RETRY_CAP_S, delay * 2)


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
    except (nats.errors.Error, TimeoutError):
        return None


async def stream_names(broker: Broker, *, subject: str | None = None) -> list[str]:
    """Every stream's name (capturing ``subject``, when given), from the meta leader.

    Raises nats-py's errors: for this package's own use.
    """
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
