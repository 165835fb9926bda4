"""The ``Agent``: handlers declared with a decorator, served over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agentreach.agents.drain import stopped_by_signals
from agentreach.agents.errors import AgentConfigError
from agentreach.agents.handlers import payload_type_of
from agentreach.agents.identity import DEFAULT_IDENTITY_FILE, resolve_agent_id
from agentreach.agents.runtime import AgentRuntime
from agentreach.broker import Auth, Broker, Names
from agentreach.broker.claim_check import DEFAULT_THRESHOLD as DEFAULT_CLAIM_CHECK_BYTES
from agentreach.broker.connection import connected
from agentreach.envelopes import AgentCard, Intent, RateLimit, is_token
from agentreach.envelopes.registry import MAX_HEARTBEAT_INTERVAL_S
from agentreach.logs import get_logger

log = get_logger("agents")

Handler = Callable[..., Any]
# The decorated function itself, as declared: `@agent.handler` keeps its type for checkers
# (`mypy --strict` called it an untyped decorator).
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True, kw_only=True)
class HandlerSpec:
    """A registered handler and the intent it serves."""

    topic: str
    func: Handler
    intent: Intent
    is_async: bool
    payload_type: Any = None  # what the handler's `payload` declares, checked before a call
    # A plain def handler's threads, as many as its capacity (the loop's default pool has
    # CPUs + 4: a handler of capacity 21 ran 6 at once, the others' budgets running out).
    threads: ThreadPoolExecutor | None = None

    @property
    def deadline_ms(self) -> int | None:
        return self.intent.deadline_ms


class Agent:
    """An agent: an identity, tags, and handlers for topics.

        agent = Agent("summarizer-1", tags={"role": "worker"}, startup_delay=0)

        @agent.handler("summarize", version="1.0", capacity=4, deadline_ms=8000,
                       description="Summarises a text in one sentence.",
                       examples=["summarise this article", "tl;dr please"])
        async def summarize(ctx: TaskContext, payload: dict) -> dict: ...

        async with agent.running(nats_url):   # registered and consuming
            ...

    Handlers may be ``async def`` (run on the event loop) or plain functions
    (run in worker threads, so a blocking handler never stalls the loop).
    """

    def __init__(
        self,
        agent_id: str | None = None,
        *,
        tags: dict[str, str] | None = None,
        heartbeat_interval: float = 15.0,
        startup_delay: float = 60.0,
        ack_wait: float = 10.0,  # well inside the default ttl (30 s): a crash is recovered
        max_deliver: int = 5,
        identity_file: str | Path = DEFAULT_IDENTITY_FILE,
        watchdog_threshold: float | None = None,
        clock: Callable[[], float] = time.time,
        rate_limit: RateLimit | None = None,
        claim_check_bytes: int = DEFAULT_CLAIM_CHECK_BYTES,
        drain_timeout: float = 10.0,
    ) -> None:
        _numbers(
            float,
            heartbeat_interval=heartbeat_interval,
            startup_delay=startup_delay,
            ack_wait=ack_wait,
            drain_timeout=drain_timeout,
            watchdog_threshold=watchdog_threshold,
        )
        _numbers(int, max_deliver=max_deliver, claim_check_bytes=claim_check_bytes)
        if agent_id is None:  # "" is a mistake, not "none given"
            agent_id = resolve_agent_id(agent_id, Path(identity_file))
        if not is_token(agent_id):
            raise AgentConfigError(
                f"agent_id {agent_id!r}: use 1-128 letters, digits, '_' or '-'"
                " (it becomes part of NATS subjects)"
            )
        if not 0 < heartbeat_interval <= MAX_HEARTBEAT_INTERVAL_S:
            raise AgentConfigError(
                f"heartbeat_interval must be above 0 and at most {MAX_HEARTBEAT_INTERVAL_S:g} s,"
                f" got {heartbeat_interval}"
            )
        if startup_delay < 0:
            raise AgentConfigError(f"startup_delay must be 0 or more, got {startup_delay}")
        if ack_wait <= 0:
            raise AgentConfigError(f"ack_wait must be positive, got {ack_wait}")
        if max_deliver < 1:
            raise AgentConfigError(f"max_deliver must be at least 1, got {max_deliver}")
        if drain_timeout <= 0:
            raise AgentConfigError(f"drain_timeout must be positive, got {drain_timeout}")
        self.agent_id = agent_id
        self.tags = _checked_tags(tags)
        self.heartbeat_interval = heartbeat_interval
        self.startup_delay = startup_delay
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.drain_timeout = drain_timeout  # how long a stop lets running handlers finish
        self.watchdog_threshold = watchdog_threshold or heartbeat_interval
        self.clock = clock
        self.rate_limit = rate_limit
        # Results above this size go to the Object Store; the reply carries a reference.
        self.claim_check_bytes = claim_check_bytes
        self.handlers: dict[str, HandlerSpec] = {}

    def handler(
        self,
        topic: str,
        *,
        version: str = "1",
        capacity: int = 10,
        deadline_ms: int | None = None,
        max_attempts: int | None = None,
        description: str = "",
        examples: Sequence[str] = (),
    ) -> Callable[[H], H]:
        """Register the decorated function as the handler of ``topic``.

        ``description`` and ``examples`` say in words what it does (in any language); the
        coordinator matches requests that name no topic (``reach.task.auto``) against them.
        """
        if callable(topic):  # @agent.handler written without its parentheses
            raise AgentConfigError(
                '@agent.handler needs the topic it serves: use @agent.handler("topic") above'
                f" {getattr(topic, '__name__', 'the handler')}, not a bare @agent.handler"
            )
        if not is_token(topic):
            raise AgentConfigError(f"topic {topic!r}: use 1-128 letters, digits, '_' or '-'")
        if topic in self.handlers:
            raise AgentConfigError(f"topic {topic!r} already has a handler on {self.agent_id}")
        _numbers(int, capacity=capacity, max_attempts=max_attempts, deadline_ms=deadline_ms)
        _at_least(1, capacity=capacity, topic=topic)
        _at_least(1, max_attempts=max_attempts, deadline_ms=deadline_ms, topic=topic)
        examples = _described(topic, description, examples)

        def register(func: H) -> H:
            if not _takes_ctx_and_payload(func):
                raise AgentConfigError(
                    f"handler {func.__name__} for {topic!r} must take (ctx, payload), both"
                    " positional"
                )
            self.handlers[topic] = HandlerSpec(
                topic=topic,
                func=func,
                intent=Intent(
                    version=version,
                    capacity=capacity,
                    deadline_ms=deadline_ms,
                    max_attempts=max_attempts,
                    description=description,
                    examples=examples,
                ),
                is_async=inspect.iscoroutinefunction(func),
                payload_type=payload_type_of(func),
                threads=None
                if inspect.iscoroutinefunction(func)
                else ThreadPoolExecutor(capacity, thread_name_prefix=f"{self.agent_id}-{topic}"),
            )
            return func

        return register

    @property
    def capacity(self) -> int:
        """How many tasks this agent runs at once: the sum of its handlers' capacities."""
        return sum(spec.intent.capacity for spec in self.handlers.values())

    def card(self, **instance: Any) -> AgentCard:
        """The card this agent registers; ``instance`` adds host, pid, epoch, …"""
        intents = {topic: spec.intent for topic, spec in self.handlers.items()}
        return AgentCard(
            agent_id=self.agent_id,
            intents=intents,
            tags=self.tags,
            rate_limit=self.rate_limit,
            **instance,
        )

    @contextlib.asynccontextmanager
    async def running(
        self,
        nats_url: str | None = None,
        *,
        broker: Broker | None = None,
        names: Names | None = None,
        auth: Auth | None = None,
    ) -> AsyncIterator[AgentRuntime]:
        """Serve for the duration of the block: registered, consuming, then drained.

        ``auth`` proves the agent's identity to NATS (default: ``NATS_CREDS`` and the
        other variables the ``nats`` CLI reads)."""
        if not self.handlers:
            raise AgentConfigError(f"agent {self.agent_id} has no handlers")
        name = f"agent:{self.agent_id}"
        async with (
            connected(broker, nats_url, name=name, names=names, wait=True, auth=auth) as connection,
            AgentRuntime(self, connection) as runtime,
        ):
            yield runtime

    async def run(
        self, nats_url: str | None = None, *, auth: Auth | None = None, on_signals: bool = True
    ) -> None:
        """Serve until cancelled, or (``on_signals``, in the main thread) until SIGTERM or
        SIGINT, which stop it as ``reach agent`` does: running handlers get ``drain_timeout``
        (a program's own ``asyncio.run(agent.run())`` died mid-handler on SIGTERM, its task
        expiring); one before it serves (while it waits for NATS) ends it too, returning.
        Raises AgentIdInUse when a newer process of the id fenced this one out."""
        starting = _Starting()
        with stopped_by_signals(starting.stop, on_signals):
            try:
                async with self.running(nats_url, auth=auth) as runtime:
                    starting.runtime = runtime
                    await runtime.wait_closed()
            except asyncio.CancelledError:
                if not starting.cancelled():  # not by a signal: the caller's cancellation
                    raise
                log.info("stopped before it served", agent_id=self.agent_id)
                return
        if runtime.replaced.is_set():
            raise runtime.replaced_error()


class _Starting:
    """What a signal stops: the runtime once it serves; before (while it waits for NATS, or
    registers), the start itself. Ctrl-C then ended a program's ``agent.run()`` with a
    traceback, and SIGTERM killed it by the signal (an outside trial)."""

    def __init__(self) -> None:
        self.runtime: AgentRuntime | None = None
        self._task = asyncio.current_task()
        self._cancelled = False

    async def stop(self) -> None:
        if self.runtime is not None:
            await self.runtime.stop()
        elif self._task is not None:
            self._cancelled = True
            self._task.cancel()

    def cancelled(self) -> bool:
        """Whether a signal cancelled the start (the cancellation is then taken back)."""
        if self._cancelled and self._task is not None:
            self._task.uncancel()
        return self._cancelled


def _checked_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """The tags, once each can be told and selected as ``name=value``: that is how routing
    rules select them (``tags: "role=worker, region=cn-east"``) and ``reach agents`` shows
    them. They travel as strings, on the card and in the NATS micro metadata."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise AgentConfigError(f"tags must map names to values, got {type(tags).__name__}")
    for name, value in tags.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise AgentConfigError(f"tag {name!r}: names and values are strings, got {value!r}")
        if not name or name != name.strip() or "=" in name or "," in name:
            raise AgentConfigError(
                f"tag {name!r}: a name is not empty and holds no '=', ',' or surrounding"
                ' spaces (rules select tags as "name=value, name=value")'
            )
    return dict(tags)


MAX_DESCRIBED = 8_000  # characters of description and examples together, per intent


def _described(topic: str, description: str, examples: Sequence[str]) -> list[str]:
    """The examples as a list, after checking both are text of a sensible size (the card is
    one KV value, read by every coordinator)."""
    if isinstance(examples, str) or not all(isinstance(e, str) for e in examples):
        raise AgentConfigError(f"examples of {topic!r} must be a list of strings")
    if not isinstance(description, str):
        raise AgentConfigError(f"description of {topic!r} must be a string")
    size = len(description) + sum(len(e) for e in examples)
    if size > MAX_DESCRIBED:
        raise AgentConfigError(
            f"description and examples of {topic!r} hold {size} characters; at most {MAX_DESCRIBED}"
        )
    return list(examples)


def _at_least(minimum: int, *, topic: str, **options: int | None) -> None:
    for name, value in options.items():
        if value is not None and value < minimum:
            raise AgentConfigError(f"{name} of {topic!r} must be at least {minimum}, got {value}")


def _numbers(kind: type[int] | type[float], **options: object) -> None:
    """AgentConfigError naming an option that is no number (``startup_delay="0"`` was a
    TypeError from inside a comparison); ``kind`` int: a whole one. None passes."""
    for name, value in options.items():
        allowed = (int,) if kind is int else (int, float)
        if value is not None and (isinstance(value, bool) or not isinstance(value, allowed)):
            what = "a whole number" if kind is int else "a number"
            raise AgentConfigError(f"{name} must be {what}, got {value!r}")


def _takes_ctx_and_payload(func: Callable[..., Any]) -> bool:
    """Whether ``func`` can be called as ``func(ctx, payload)``: a ``payload`` keyword-only
    parameter was accepted, then failed every run with a retryable TypeError."""
    parameters = list(inspect.signature(func).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return len(parameters) == 2 and all(p.kind in positional for p in parameters)
