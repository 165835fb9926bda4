"""The cost of intent resolution at 1,000 agents (used by ``bench/intent.py``).

Synthetic cards: 1,000 agents over 50 or 1,000 intents, each with its own wording (the real
cards' words and characters, shuffled), about 3,000 texts; the queries are the labelled
requests. Measured: one ranking by the scorer alone, one whole resolution as the coordinator
does it (text from the payload, the live agents' intents, the record for the ``routed``
event), the index build, and a refit after one agent edited its card.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable

import numpy as np

from agentreach.coordinator.routing.intents.resolver import IntentResolver, ResolveConfig
from agentreach.coordinator.routing.intents.types import IntentText, Scorer
from agentreach.envelopes import AgentCard, Intent, Task


def synthetic_cards(
    n_agents: int, n_intents: int, real: dict[str, IntentText], seed: int = 7
) -> list[dict[str, IntentText]]:
    """``n_agents`` cards over ``n_intents`` intents (the real ones first, then made-up ones),
    every card with its own wording: realistic text lengths and a bilingual mix."""
    rng = random.Random(seed)
    words = sorted(
        {
            w.strip(".,:;?!'()").lower()
            for t in real.values()
            for s in t.texts()
            for w in s.split()
            if w.isascii() and w.isalpha()
        }
    )
    hanzi = sorted(
        {c for t in real.values() for s in t.texts() for c in s if "\u4e00" <= c <= "\u9fff"}
    )

    def sentence(n: int) -> str:
        en = " ".join(
            rng.choice(words) if rng.random() < 0.7 else f"w{rng.randrange(5000)}" for _ in range(n)
        )
        zh = "".join(rng.choice(hanzi) for _ in range(n))
        return f"{en}. {zh}。"

    names = list(real) + [f"intent_{i:04d}" for i in range(max(0, n_intents - len(real)))]
    cards = []
    for a in range(n_agents):
        name = names[a % len(names)]
        base = real.get(name)
        description = (base.description + " " if base else "") + sentence(12)
        examples = (base.examples if base else ()) + tuple(sentence(5) for _ in range(2))
        cards.append({name: IntentText(description, examples)})
    return cards


def merge(cards: list[dict[str, IntentText]]) -> dict[str, IntentText]:
    parts: dict[str, list[IntentText]] = {}
    for card in cards:
        for name, text in card.items():
            parts.setdefault(name, []).append(text)
    return {name: IntentText.merge(p) for name, p in parts.items()}


class RandomEncoder:
    """Stands in for the model while building a large index: its cost is measured separately."""

    def __init__(self, dim: int = 384) -> None:
        self.rng, self.dim = np.random.default_rng(0), dim

    def encode(self, texts: list[str]) -> np.ndarray:
        v = self.rng.standard_normal((len(texts), self.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def scale(
    name: str, make: Callable[[], Scorer], real: dict[str, IntentText], texts: list[str]
) -> None:
    """One table row per index size for the scorer ``make`` builds."""
    for n_intents in (50, 1000):
        cards = synthetic_cards(1000, n_intents, real)
        intents = merge(cards)
        n_texts = sum(len(t.texts()) for t in intents.values())
        scorer = make()
        encoder = getattr(scorer, "encoder", None)
        if encoder is not None:  # embed a sample for the build cost, stub the rest
            sample = [t for v in list(intents.values())[:40] for t in v.texts()][:200]
            start = time.perf_counter()
            encoder.encode(sample)
            per_text = (time.perf_counter() - start) / len(sample)
            setattr(scorer, "encoder", RandomEncoder())  # noqa: B010 (Scorer has no encoder)
        start = time.perf_counter()
        scorer.fit(intents)
        build = time.perf_counter() - start
        # one agent edits its card: refit with everything else cached
        edited = dict(intents)
        first = next(iter(edited))
        edited[first] = IntentText(
            edited[first].description + " also handles gift cards 礼品卡", edited[first].examples
        )
        start = time.perf_counter()
        scorer.fit(edited)
        refit = time.perf_counter() - start
        if encoder is not None:
            setattr(scorer, "encoder", encoder)  # noqa: B010
            total = build + per_text * n_texts
            build_note = (
                f"build {total:.1f} s (embedding {per_text * 1e3:.1f} ms/text, measured on 200)"
            )
            refit_note = f"refit after one card changed {(refit + per_text) * 1e3:.0f} ms"
        else:
            build_note = f"build {build * 1e3:.0f} ms"
            refit_note = f"refit after one card changed {refit * 1e3:.0f} ms"
        for t in texts[:20]:
            scorer.rank(t)  # warm-up
        times = []
        for t in texts:
            start = time.perf_counter()
            scorer.rank(t)
            times.append((time.perf_counter() - start) * 1e6)
        whole = asyncio.run(resolutions(cards, scorer, texts))
        print(
            f"| {name} | 1,000 agents / {len(intents)} intents | {n_texts} "
            f"| {statistics.median(times):,.0f} µs "
            f"| {np.percentile(times, 99):,.0f} µs "
            f"| {statistics.median(whole):,.0f} µs / {np.percentile(whole, 99):,.0f} µs "
            f"| {build_note}; {refit_note} |"
        )


class Directory:
    """The agent directory as the resolver reads it: cards, liveness, change counters."""

    def __init__(self, cards: list[AgentCard]) -> None:
        self.cards = {card.agent_id: card for card in cards}
        self.version = self.liveness_version = 1

    def is_live(self, card: AgentCard) -> bool:
        return True


async def resolutions(
    cards: list[dict[str, IntentText]], scorer: Scorer, texts: list[str]
) -> list[float]:
    """µs per whole resolution of a task on ``auto``, the index fitted beforehand."""
    directory = Directory(
        [
            AgentCard(
                agent_id=f"agent-{i:04d}",
                intents={
                    name: Intent(description=text.description, examples=list(text.examples))
                    for name, text in card.items()
                },
            )
            for i, card in enumerate(cards)
        ]
    )
    resolver = IntentResolver(directory, ResolveConfig(), scorer=scorer)  # type: ignore[arg-type]
    tasks = [
        Task(v=1, message_id=f"m{i}", trace_id=f"m{i}", topic="auto", payload={"text": t})
        for i, t in enumerate(texts)
    ]
    await resolver.resolve(tasks[0])  # the refit, measured above
    times = []
    for task in tasks:
        start = time.perf_counter()
        await resolver.resolve(task)
        times.append((time.perf_counter() - start) * 1e6)
    return times
