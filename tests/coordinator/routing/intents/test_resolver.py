"""The coordinator's resolver over a directory: live agents only, one refit per change shared
by concurrent resolutions, the record it leaves on the task (no server needed)."""

from __future__ import annotations

import asyncio

import pytest

from agentreach.coordinator import ConfigError, load_config
from agentreach.coordinator.routing.intents import resolver as resolver_module
from agentreach.coordinator.routing.intents.errors import ScorerUnavailable
from agentreach.coordinator.routing.intents.resolver import (
    IntentResolver,
    ResolveConfig,
    Resolving,
)
from agentreach.coordinator.routing.intents.types import Scored
from agentreach.envelopes import AgentCard, Intent, Task

REFUND = Intent(description="Refunds for paid orders: money back 退款", examples=["refund me"])
RISK = Intent(description="Fraud: unauthorised charges, stolen cards 盗刷")


class Directory:
    """What the resolver reads of the agent directory."""

    def __init__(self, *cards: AgentCard) -> None:
        self.cards = {card.agent_id: card for card in cards}
        self.offline: set[str] = set()
        self.version = self.liveness_version = 0

    def is_live(self, card: AgentCard) -> bool:
        return card.status == "running" and card.agent_id not in self.offline


def task(payload: object, topic: str = "auto") -> Task:
    return Task(v=1, message_id="m", trace_id="m", topic=topic, payload=payload)


async def test_resolution_sets_topic_and_record_and_follows_liveness() -> None:
    """The best live intent becomes the topic; an agent going OFFLINE leaves the index."""
    directory = Directory(
        AgentCard(agent_id="cs", intents={"refund_application": REFUND}),
        AgentCard(agent_id="risk", intents={"risk_review": RISK}),
    )
    resolver = IntentResolver(directory, ResolveConfig())  # type: ignore[arg-type]
    resolved = await resolver.resolve(task({"text": "someone used my stolen card 盗刷"}))
    assert resolved.topic == "risk_review" and resolved.resolution is not None
    assert resolved.resolution.topic == "auto" and resolved.resolution.scorer == "bm25"
    assert resolved.resolution.runner_up.intent == "refund_application"  # type: ignore[union-attr]
    assert resolved.confidence == resolved.resolution.best.confidence  # type: ignore[union-attr]
    directory.offline.add("risk")
    directory.liveness_version += 1
    again = await resolver.resolve(task({"text": "someone used my stolen card 盗刷"}))
    assert again.topic == "refund_application" and again.resolution.runner_up is None  # type: ignore[union-attr]
    assert resolver.index.fits == 2


async def test_concurrent_resolutions_share_one_refit_in_a_thread() -> None:
    """A burst of requests after a change waits for one refit, not one each."""
    directory = Directory(AgentCard(agent_id="cs", intents={"refund_application": REFUND}))
    resolver = IntentResolver(directory, ResolveConfig())  # type: ignore[arg-type]
    done = await asyncio.gather(*(resolver.resolve(task("refund me")) for _ in range(20)))
    assert {t.topic for t in done} == {"refund_application"} and resolver.index.fits == 1


async def test_no_text_and_no_described_intent_leave_a_note_and_the_topic() -> None:
    """Without text, or with no agent describing an intent, there is no candidate: the note
    says why and the topic stays as published."""
    directory = Directory(AgentCard(agent_id="quiet", intents={"x": Intent()}))
    resolver = IntentResolver(directory, ResolveConfig())  # type: ignore[arg-type]
    blank = await resolver.resolve(task({"order": 7}))
    nobody = await resolver.resolve(task({"text": "refund me"}))
    assert blank.topic == "auto" and blank.confidence == 0.0
    assert blank.resolution.note == "no text to resolve at payload.text"  # type: ignore[union-attr]
    assert nobody.resolution.note == "no live agent describes its intents"  # type: ignore[union-attr]


def test_default_resolution_without_its_extra_says_what_to_install(monkeypatch) -> None:
    """With no `resolve` section and no extra, the router learns why (no error at start)."""

    def missing(name: str) -> None:
        raise ScorerUnavailable(
            "intent resolution needs its extra: pip install 'agentreach[intents]'"
        )

    monkeypatch.setattr(resolver_module, "load_scorer", missing)
    resolving = Resolving(Directory(), None)  # type: ignore[arg-type]
    why = resolving.resolver()
    assert isinstance(why, str) and "agentreach[intents]" in why
    assert resolving.same(None) and not resolving.same(ResolveConfig(topics=["ask"]))


@pytest.mark.parametrize("text", ["x" * 100_000, "天" * 50_000])
async def test_a_huge_text_is_read_only_as_far_as_its_start(text: str) -> None:
    """Only the first 4,096 characters are scored, so a large payload costs no more: a word
    past them is not seen."""
    directory = Directory(AgentCard(agent_id="cs", intents={"refund_application": REFUND}))
    resolver = IntentResolver(directory, ResolveConfig())  # type: ignore[arg-type]
    wanted = "refund me the money for my paid order"
    assert (await resolver.resolve(task(wanted))).confidence > 0.9
    assert (await resolver.resolve(task(text + " " + wanted))).confidence < 0.3


class KeywordScorer:
    """A scorer of one's own: an intent is sure when its name is in the text."""

    name = "keywords"

    def __init__(self) -> None:
        self.intents: list[str] = []

    def fit(self, intents) -> None:  # type: ignore[no-untyped-def]
        self.intents = sorted(intents)

    def rank(self, text: str, k: int = 5) -> list[Scored]:
        scored = [Scored(i, 1.0 if i in text else 0.0, 0.0) for i in self.intents]
        return sorted(scored, key=lambda s: -s.confidence)[:k]


def test_a_scorer_of_ones_own_is_named_module_colon_factory(tmp_path) -> None:
    """`resolve.scorer: module:factory` loads your scorer; a wrong one fails at start."""
    own = "tests.coordinator.routing.intents.test_resolver:KeywordScorer"
    config = tmp_path / "c.yaml"
    config.write_text(f"routing:\n  resolve: {{scorer: '{own}'}}\n")
    resolve = load_config(config).routing.resolve
    assert resolve is not None and resolve.scorer == own
    directory = Directory(AgentCard(agent_id="cs", intents={"refund_application": REFUND}))
    resolver = IntentResolver(directory, resolve)  # type: ignore[arg-type]
    assert resolver.index.scorer.name == "keywords"
    config.write_text("routing:\n  resolve: {scorer: 'tests.nowhere:Scorer'}\n")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_config(config)


async def test_own_scorer_resolves() -> None:
    """The resolver uses whatever the factory returns."""
    directory = Directory(AgentCard(agent_id="cs", intents={"refund_application": REFUND}))
    resolver = IntentResolver(directory, ResolveConfig(), scorer=KeywordScorer())  # type: ignore[arg-type]
    resolved = await resolver.resolve(task("about refund_application please"))
    assert resolved.topic == "refund_application" and resolved.confidence == 1.0
