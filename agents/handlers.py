"""Calling a handler within its deadline, checking that its result can be sent, and the
error a failure of either is reported as.

An ``async def`` handler runs on the event loop and is cancelled when its deadline passes. A
plain function runs in a worker thread, which cannot be stopped: one past its deadline is
waited for, with its claim kept live meanwhile, and its outcome — a late result, or its own
error — is the outcome of the run. Reporting ``deadline_exceeded`` while it still ran would
let the coordinator start a retry beside it, and the work would happen twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from agentreach import envelopes
from agentreach.agents.context import TaskContext
from agentreach.agents.deadline import Deadline
from agentreach.agents.drain import IN_THREADS
from agentreach.agents.errors import (
    DeadlineExceeded,
    InvokeError,
    NotAcknowledged,
    NotStored,
    PermanentError,
)
from agentreach.envelopes import SUB_TASK_FAILED, ErrorInfo
from agentreach.envelopes.misfits import first_misfit
from agentreach.logs import get_logger

if TYPE_CHECKING:
    from agentreach.agents.agent import HandlerSpec

log = get_logger("agents")

OVERRUN = "past its deadline in a thread; it cannot be stopped: its outcome waits for it"

# While a thread runs past its deadline: keeps the run's claim (and so the message) its own.
Overrun = Callable[[], contextlib.AbstractAsyncContextManager[None]]


class DeadlinePassed(TimeoutError):
    """The handler's deadline passed while it ran: reported as ``deadline_exceeded``. A
    ``TimeoutError`` the handler raises itself in time (an upstream call's) is reported as
    what it is: it read "handler ran past 30000 ms" after 2 ms, its message nowhere."""


class HandlerExited(Exception):
    """The handler raised SystemExit (a library's ``sys.exit()``): the task fails with it
    (type ``SystemExit``), and the agent serves on. It stopped the whole agent, saying only
    "agent stopped"."""


async def call(
    spec: HandlerSpec, ctx: TaskContext, payload: Any, deadline: Deadline, *, overrun: Overrun
) -> Any:
    """The handler's result; raises what it raised (SystemExit as HandlerExited), or
    DeadlinePassed past its deadline."""
    if spec.is_async:
        try:
            async with asyncio.timeout(None) as scope:
                deadline.enforce(scope)
                return await spec.func(ctx, payload)
        except SystemExit as exc:
            raise _exited(exc) from exc
        except TimeoutError as exc:
            if scope.expired():
                raise DeadlinePassed(f"past {deadline.total_ms} ms") from exc
            raise
    return await _in_thread(spec, ctx, payload, deadline, overrun)


async def _in_thread(
    spec: HandlerSpec, ctx: TaskContext, payload: Any, deadline: Deadline, overrun: Overrun
) -> Any:
    # In the handler's own threads, with this task's context (as asyncio.to_thread does)
    in_context = functools.partial(contextvars.copy_context().run, _no_exit, spec.func)
    running = asyncio.get_running_loop().run_in_executor(spec.threads, in_context, ctx, payload)
    job = asyncio.current_task()
    if job is not None:
        IN_THREADS.add(job)  # a stop's drain waits for it: see agents.drain
    try:
        async with asyncio.timeout(None) as scope:
            deadline.enforce(scope)
            return await asyncio.shield(running)
    except TimeoutError:
        if not scope.expired():
            raise  # the handler's own, in time
    finally:
        if job is not None and running.done():
            IN_THREADS.discard(job)
    log.warning(OVERRUN, deadline_ms=deadline.total_ms)
    deadline.overrun = True
    async with overrun():
        try:
            return await running
        except TimeoutError as exc:  # past its deadline, its own timeout ended it
            raise DeadlinePassed(f"past {deadline.total_ms} ms") from exc
        finally:
            if job is not None:
                IN_THREADS.discard(job)


def _no_exit(func: Callable[..., Any], ctx: TaskContext, payload: Any) -> Any:
    """``func`` in its thread, a SystemExit raised there: HandlerExited (out of the thread,
    asyncio would raise it through the event loop)."""
    try:
        return func(ctx, payload)
    except SystemExit as exc:
        raise _exited(exc) from exc


def _exited(exc: SystemExit) -> HandlerExited:
    return HandlerExited(f"the handler raised SystemExit({exc.code!r}) (sys.exit())")


class InvalidPayload(Exception):
    """The payload does not fit the type the handler's ``payload`` parameter declares. The
    sender's mistake, not the agent's: it is not retried, and it does not count against the
    agent's health (one caller's bad input must not isolate an agent for everyone)."""


def payload_type_of(func: Callable[..., Any]) -> Any:
    """The type ``func``'s second parameter declares, to check payloads against; None when
    it declares none, or one that cannot be resolved here (a name local to a function)."""
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # a forward reference nobody can resolve: nothing to check against
        return None
    name = list(inspect.signature(func).parameters)[1]
    declared = hints.get(name)
    return None if declared in (None, Any, object) else declared


def typed(payload: Any, declared: Any) -> Any:
    """``payload`` as the handler declared it (a dict for ``dict``, an instance of a Struct
    or dataclass); InvalidPayload, saying where it does not fit, when it cannot be. A task
    sent with no payload (null) is passed as it is: the handler decides what none means."""
    if declared is None or payload is None:
        return payload
    try:
        return msgspec.convert(payload, declared)
    except (msgspec.ValidationError, TypeError) as exc:
        said = (_keyed(payload, declared) if "`$[...]" in str(exc) else None) or str(exc)
        raise InvalidPayload(
            f"the payload does not fit the handler's `payload: {type_name(declared)}`: {said}"
        ) from exc


def _keyed(payload: Any, declared: Any) -> str | None:
    """Why ``payload`` does not fit ``declared``, a ``dict[K, V]``, naming the key whose value
    does not (msgspec says only `$[...]`); None when it is no such dict."""
    if (found := first_misfit(payload, declared)) is None:
        return None
    key, exc = found
    inner = typing.get_args(declared)[1]
    said = (_keyed(payload[key], inner) if "`$[...]" in str(exc) else None) or str(exc)
    step = f"$.{key}" if str(key).isidentifier() else f"$[{msgspec.json.encode(key).decode()}]"
    if " - at `$" in said:
        return said.replace(" - at `$", f" - at `{step}", 1)
    return f"{said} - at `{step}`"


def type_name(declared: Any) -> str:
    """How a type reads in a message: ``Question``, ``dict``, ``list[int]``."""
    if typing.get_args(declared):  # dict[str, str] has the __name__ of dict
        return repr(declared)
    return getattr(declared, "__name__", None) or repr(declared)


def failed_on_null(exc: Exception, payload: Any, declared: Any) -> Exception:
    """``exc``, or InvalidPayload when the handler raised it on a null payload its declared
    type does not admit (``payload: Question``, not ``Question | None``): null is passed
    through (a chain's step after one that returned nothing may ignore it), but a handler
    that breaks on it (AttributeError, TypeError: None used as a dict or an object) was sent
    what it does not take, and a caller's nulls must not isolate the agent for everyone. Any
    other failure stays its own."""
    if payload is not None or declared is None:
        return exc
    # What using None as a dict or an object raises; any other failure (a connection that is
    # down) is the handler's own, null payload or not.
    if not isinstance(exc, AttributeError | TypeError):
        return exc
    try:
        msgspec.convert(None, declared)
    except (msgspec.ValidationError, TypeError):
        shown = type_name(declared)
        return InvalidPayload(
            f"the payload is null, which the handler's `payload: {shown}` does not admit (it"
            f" raised {type(exc).__name__}: {exc}); declare `{shown} | None` to take none"
        )
    return exc  # it admits null: its failure is its own


class InvalidResult(Exception):
    """The handler returned a value that cannot be sent as JSON. Running it again would
    repeat its work (and its side effects) for the same result: it is not retried."""


def sendable(result: Any) -> Any:
    """``result``, when it can be encoded as JSON; else InvalidResult, saying why."""
    try:
        envelopes.encode(result)
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        raise InvalidResult(
            f"the handler's result could not be sent: it cannot be encoded as JSON ({exc})"
        ) from exc
    return result


def sub_task_failed(exc: InvokeError) -> ErrorInfo:
    """A handler failed because a task it sent (``ctx.invoke``, a client of its own) did:
    ``sub_task_failed``, which the coordinator does not count against this agent's health
    (a dependency's failure must not isolate the agent that called it). Retryable while the
    sub-task may still end well (not accepted yet, no result yet, not stored): a run again
    attaches to it. Not when it ended: a run again hears the same end."""
    open_ended = isinstance(exc, NotAcknowledged | DeadlineExceeded | NotStored) or (
        type(exc) is InvokeError
    )
    return ErrorInfo(
        type=SUB_TASK_FAILED,
        message=f"sub-task {exc.message_id} failed: {type(exc).__name__}: {exc}",
        retryable=open_ended,
    )


def error_info(exc: Exception, deadline_ms: int) -> ErrorInfo:
    """How a handler's failure is reported: its class name, message, and whether to retry."""
    if isinstance(exc, InvalidResult):
        return ErrorInfo(type="invalid_result", message=str(exc), retryable=False)
    if isinstance(exc, InvalidPayload):
        return ErrorInfo(type="invalid_payload", message=str(exc), retryable=False)
    if isinstance(exc, InvokeError):
        return sub_task_failed(exc)
    if isinstance(exc, HandlerExited):
        return ErrorInfo(type="SystemExit", message=str(exc), retryable=True)
    if isinstance(exc, DeadlinePassed):
        return ErrorInfo(
            type="deadline_exceeded", message=f"handler ran past {deadline_ms} ms", retryable=True
        )
    return ErrorInfo(
        type=type(exc).__name__,
        message=str(exc) or type(exc).__name__,
        retryable=not isinstance(exc, PermanentError),
    )
