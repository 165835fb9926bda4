"""Finding a task's intent from its text, against what every live agent says it does.

Each coordinator replica keeps its own :class:`IntentIndex`, derived from the agent directory
(itself kept current by a KV watch): the index is never the only copy of anything. When the
directory changes, the next resolution refits the index once, in a worker thread (BM25 over
1,000 agents takes a tenth of a second), and waits for it, so a request is always judged
against the cards as they are. Only tasks that need it are resolved: those published on a
resolve topic (``auto``), and, when ``unknown_topics`` is on, those on a topic that no rule,
workflow or agent serves.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import structlog

from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.coordinator.routing.intents.errors import ScorerUnavailable
from agentreach.coordinator.routing.intents.index import IntentIndex
from agentreach.coordinator.routing.intents.scorers import ScorerName, load_scorer
from agentreach.coordinator.routing.intents.types import IntentText, Scored, Scorer
from agentreach.envelopes import AgentCard, Candidate, Resolution, Task
from agentreach.envelopes.messages import Token

log = structlog.get_logger("coordinator.intents")

MAX_TEXT = 4096  # characters of a request that are read: its intent is in its first lines


class ResolveConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which tasks get their intent from their text, where the text is, and the scorer."""

    topics: list[Token] = msgspec.field(default_factory=lambda: ["auto"])
    unknown_topics: bool = False
    text_field: str = "text"  # a dotted path in the payload; a payload that is a string is the text
    scorer: ScorerName = "bm25"


class IntentResolver:
    """Resolves tasks against the intents of every live agent that describes them."""

    def __init__(
        self, directory: AgentDirectory, config: ResolveConfig, scorer: Scorer | None = None
    ) -> None:
        self.config = config
        self._directory = directory
        self._index = IntentIndex(scorer or load_scorer(config.scorer))
        self._seen: tuple[int, int] = (-1, -1)
        self._refit: asyncio.Task[None] | None = None

    @property
    def index(self) -> IntentIndex:
        return self._index

    async def resolve(self, task: Task) -> Task:
        """``task`` with its best intent as ``topic`` (unchanged when there is none) and the
        :class:`Resolution` that says how sure that is and what came second."""
        scorer = self._index.scorer.name
        text = text_of(task.payload, self.config.text_field)
        if text is None:
            note = f"no text to resolve at payload.{self.config.text_field}"
            return _with(task, Resolution(topic=task.topic, scorer=scorer, note=note))
        await self._current()
        ranked = self._index.rank(text[:MAX_TEXT], k=2)
        best, runner_up = [*ranked, None, None][:2]  # type: ignore[list-item]
        note = "" if best else "no live agent describes its intents"
        resolution = Resolution(
            topic=task.topic,
            scorer=scorer,
            best=_candidate(best),
            runner_up=_candidate(runner_up),
            note=note,
        )
        return _with(task, resolution)

    async def _current(self) -> None:
        """Bring the index up to the directory, refitting in a worker thread if a card (or
        an agent's liveness) changed; concurrent callers share one refit."""
        seen = (self._directory.version, self._directory.liveness_version)
        if seen != self._seen:
            self._seen = seen
            self._sync()
        while True:
            if self._refit is not None:
                refit = self._refit
                try:
                    await asyncio.shield(refit)
                finally:
                    if self._refit is refit and refit.done():
                        self._refit = None
                continue
            intents = self._index.changed()
            if intents is None:
                return
            log.debug("refitting intents", intents=len(intents))
            self._refit = asyncio.create_task(asyncio.to_thread(self._index.fit, intents))

    def _sync(self) -> None:
        live = {}
        for card in self._directory.cards.values():
            if self._directory.is_live(card) and (described := intent_texts(card)):
                live[card.agent_id] = described
        for gone in self._index.agents() - live.keys():
            self._index.remove(gone)
        for agent_id, described in live.items():
            self._index.put(agent_id, described)


def intent_texts(card: AgentCard) -> dict[str, IntentText]:
    """The intents ``card`` describes in words; an intent with neither a description nor an
    example cannot be matched by meaning and is left out."""
    return {
        name: IntentText(intent.description, tuple(intent.examples))
        for name, intent in card.intents.items()
        if intent.description.strip() or any(e.strip() for e in intent.examples)
    }


def text_of(payload: Any, field: str) -> str | None:
    """The free text of a payload: the string at ``field`` (a dotted path), or the payload
    itself when it is a string; None when there is none."""
    if isinstance(payload, str):
        return payload if payload.strip() else None
    value: Any = payload
    for key in field.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, str) and value.strip() else None


def _candidate(scored: Scored | None) -> Candidate | None:
    if scored is None:
        return None
    return Candidate(
        intent=scored.intent,
        confidence=round(scored.confidence, 4),
        evidence=round(scored.score, 4),
    )


def _with(task: Task, resolution: Resolution) -> Task:
    topic = resolution.best.intent if resolution.best else task.topic
    return msgspec.structs.replace(task, topic=topic, resolution=resolution)


def describe(resolution: Resolution) -> str:
    """ "'refund_application' 0.87 over 'complaint' 0.41", or why there is no candidate."""
    if resolution.best is None:
        return resolution.note or "no candidate"
    line = f"'{resolution.best.intent}' {resolution.best.confidence:.2f}"
    if resolution.runner_up is not None:
        line += f" over '{resolution.runner_up.intent}' {resolution.runner_up.confidence:.2f}"
    return line


class Resolving:
    """Which tasks the router resolves under one routing config, and the resolver, made on
    first use (a coordinator that never sees such a task never loads numpy or a model)."""

    def __init__(self, directory: AgentDirectory, config: ResolveConfig | None) -> None:
        self._directory = directory
        self.asked = config is not None  # the config names it (else: the default, if installed)
        self.config = config or ResolveConfig()
        self._resolver: IntentResolver | None = None
        self._unavailable = ""

    def same(self, config: ResolveConfig | None) -> bool:
        """Whether ``config`` asks for what this already does (a reload keeps the index)."""
        return (config is not None) == self.asked and (config or ResolveConfig()) == self.config

    def resolver(self) -> IntentResolver | str:
        """The resolver, or why there is none (its extra is not installed)."""
        if self._resolver is None and not self._unavailable:
            try:
                self._resolver = IntentResolver(self._directory, self.config)
            except ScorerUnavailable as exc:
                self._unavailable = str(exc)
                log.warning("intent resolution is off", why=self._unavailable)
        return self._resolver or self._unavailable
