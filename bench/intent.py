"""Benchmark of the intent scorers on the labelled set in bench/data/intents (11 intents as
agents describe them, 319 requests — half Chinese, 51 out of scope, 31 ambiguous, 50 of one or
two words).

For each scorer: top-1 accuracy, then at thresholds 0.3 … 0.9 what happens to every request —
delivered to its intent, delivered to an intent the labeller also accepted (``alt``), delivered
wrongly (to another intent, or an out-of-scope request delivered at all), or sent to manual review
— with confidences calibrated by 5-fold cross-validation (each fold's calibration is fitted on the
other four folds only), so the table is not the calibration grading its own homework. Then the
cost of one resolution with 1,000 agents, and of building the index.

    .venv/bin/python bench/intent.py              # every scorer (minilm needs its model wheel)
    .venv/bin/python bench/intent.py --scorers bm25 --no-scale
    .venv/bin/python bench/intent.py --fit        # pick pseudo-counts, fit calibrations on all
    .venv/bin/python bench/intent.py --fit --cards mine.json --requests mine.jsonl --no-scale

"wrong" is a delivery to an intent that is neither the label nor one the labeller also
accepted, or any delivery of an out-of-scope request; "accuracy" counts requests delivered
right plus out-of-scope ones sent to manual review; "short" requests are those of at most two
words (``calibration.words``), where a scorer is most easily sure on little evidence. Needs the
``intents`` extra.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from intent_scale import scale

from agentreach.cli.logs import configure_logging
from agentreach.coordinator.routing.intents.calibration import Calibration, features, words
from agentreach.coordinator.routing.intents.errors import ScorerUnavailable
from agentreach.coordinator.routing.intents.lexical import BM25Scorer
from agentreach.coordinator.routing.intents.text import Tokenizer
from agentreach.coordinator.routing.intents.types import IntentText, Scorer

DATA = Path(__file__).resolve().parent / "data" / "intents"
NONE = "none"  # the label of a request no agent should get: it belongs in manual review
_CJK = re.compile(r"[\u4e00-\u9fff]")

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9)
RECOMMENDED = 0.75
WRONG_COST = 4.0  # a wrong delivery costs as much as 4 manual reviews: the threshold 1 - 1/4
FOLDS = 5
TOP = 3  # candidates per request used to fit the calibration
SHORT = 2  # words: a request this short says little, whatever it matches
LEXICAL_GRID = (0, 1, 2, 4, 6, 8, 10, 15)  # the pseudo-counts --fit tries, in words
PSEUDO_GRID = {"bm25": LEXICAL_GRID, "bm25-bigram": LEXICAL_GRID, "minilm": (0, 0.5, 1, 2, 3, 5)}


@dataclass(frozen=True, slots=True)
class Request:
    """A labelled request. ``also`` names intents a reasonable person could also pick."""

    text: str
    intent: str
    also: tuple[str, ...] = ()

    @property
    def lang(self) -> str:
        return "zh" if _CJK.search(self.text) else "en"


def load_cards(path: Path) -> dict[str, IntentText]:
    """Intent name -> its description and examples, as agents would register them."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {k: IntentText(v["description"], tuple(v.get("examples", ()))) for k, v in raw.items()}


def load_requests(path: Path) -> list[Request]:
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [Request(r["text"], r["intent"], tuple(r.get("also", ()))) for r in rows]


def scorers(names: list[str]) -> dict[str, Callable[[], Scorer]]:
    def minilm() -> Scorer:
        from agentreach.coordinator.routing.intents.embedding import EmbeddingScorer

        return EmbeddingScorer()

    known: dict[str, Callable[[], Scorer]] = {
        "bm25": lambda: BM25Scorer(),
        "bm25-bigram": lambda: BM25Scorer(tokenizer=Tokenizer(chinese="bigram")),
        "minilm": minilm,
    }
    unknown = set(names) - set(known)
    if unknown:
        raise SystemExit(f"unknown scorers {sorted(unknown)}: use {', '.join(known)}")
    return {n: known[n] for n in names}


@dataclass
class Ranked:
    request: Request
    candidates: list[tuple[str, float]]  # (intent, evidence), best first


def rank_all(scorer: Scorer, requests: list[Request]) -> tuple[list[Ranked], float]:
    """Every request ranked once; also the mean µs per resolution."""
    out, start = [], time.perf_counter()
    for r in requests:
        out.append(Ranked(r, [(s.intent, s.score) for s in scorer.rank(r.text, TOP)]))
    return out, (time.perf_counter() - start) / len(requests) * 1e6


def samples(ranked: list[Ranked]) -> list[tuple[float, float, bool]]:
    out = []
    for item in ranked:
        feats = features([e for _, e in item.candidates])
        out += [
            (e, m, name == item.request.intent)
            for (name, _), (e, m) in zip(item.candidates, feats, strict=True)
        ]
    return out


def folds(requests: list[Request]) -> list[int]:
    """Stratified and deterministic: the n-th request of each label goes to fold n % FOLDS."""
    seen: dict[str, int] = {}
    out = []
    for r in requests:
        out.append(seen.get(r.intent, 0) % FOLDS)
        seen[r.intent] = seen.get(r.intent, 0) + 1
    return out


def cross_validated(ranked: list[Ranked]) -> list[tuple[str, float]]:
    """(top intent, calibrated confidence) per request, calibrated without its own fold."""
    fold = folds([x.request for x in ranked])
    out: list[tuple[str, float]] = [("", 0.0)] * len(ranked)
    for f in range(FOLDS):
        cal = Calibration.fit(samples([x for x, k in zip(ranked, fold, strict=True) if k != f]))
        for i, x in enumerate(ranked):
            if fold[i] == f:
                (name, _), (e, m) = x.candidates[0], features([e for _, e in x.candidates])[0]
                out[i] = (name, cal.confidence(e, m))
    return out


def outcome(r: Request, intent: str, conf: float, threshold: float) -> str:
    if conf < threshold:
        return "manual"
    if intent == r.intent:
        return "right"
    return "alt" if intent in r.also else "wrong"


def table(name: str, ranked: list[Ranked], decided: list[tuple[str, float]]) -> dict[float, dict]:
    reqs = [x.request for x in ranked]
    in_scope = [i for i, r in enumerate(reqs) if r.intent != NONE]
    top1 = sum(ranked[i].candidates[0][0] == reqs[i].intent for i in in_scope) / len(in_scope)
    by_lang = {}
    for lang in ("en", "zh"):
        idx = [i for i in in_scope if reqs[i].lang == lang]
        by_lang[lang] = sum(ranked[i].candidates[0][0] == reqs[i].intent for i in idx) / len(idx)
    print(
        f"\n## {name}  (top-1 accuracy on {len(in_scope)} in-scope requests: {top1:.1%};"
        f" en {by_lang['en']:.1%}, zh {by_lang['zh']:.1%})"
    )
    reliability(reqs, decided)
    print("| threshold | accuracy | delivered right | alt | **wrong** | manual | cost/request |")
    print("|---|---|---|---|---|---|---|")
    rows = {}
    for t in THRESHOLDS:
        counts = {"right": 0, "alt": 0, "wrong": 0, "manual": 0, "ok": 0}
        for r, (intent, conf) in zip(reqs, decided, strict=True):
            o = outcome(r, intent, conf, t)
            counts[o] += 1
            counts["ok"] += o == "right" or (o == "manual" and r.intent == NONE)
        n = len(reqs)
        cost = (counts["wrong"] * WRONG_COST + counts["manual"]) / n
        rows[t] = {k: v / n for k, v in counts.items()} | {"cost": cost}
        mark = " ←" if t == RECOMMENDED else ""
        print(
            f"| {t:.2f}{mark} | {counts['ok'] / n:.1%} | {counts['right'] / n:.1%}"
            f" | {counts['alt'] / n:.1%} | {counts['wrong'] / n:.1%} ({counts['wrong']})"
            f" | {counts['manual'] / n:.1%} | {cost:.3f} |"
        )
    best = min(rows, key=lambda t: (rows[t]["cost"], -t))
    print(f"lowest cost (wrong = {WRONG_COST:g} manual reviews): threshold {best:.2f}")
    per_lang(reqs, decided)
    return rows


def per_lang(reqs: list[Request], decided: list[tuple[str, float]]) -> None:
    parts = []
    for lang in ("en", "zh"):
        idx = [i for i, r in enumerate(reqs) if r.lang == lang]
        outs = [outcome(reqs[i], *decided[i], RECOMMENDED) for i in idx]
        parts.append(
            f"{lang}: right {outs.count('right') / len(idx):.0%}, wrong {outs.count('wrong')}, "
            f"manual {outs.count('manual') / len(idx):.0%}"
        )
    print(f"at {RECOMMENDED}: " + "; ".join(parts))


def log_loss(reqs: list[Request], decided: list[tuple[str, float]]) -> float:
    right = np.array([i == r.intent for r, (i, _) in zip(reqs, decided, strict=True)])
    conf = np.array([c for _, c in decided])
    return float(-np.log(np.clip(np.where(right, conf, 1 - conf), 1e-12, 1)).mean())


def reliability(reqs: list[Request], decided: list[tuple[str, float]]) -> None:
    """Expected calibration error (|mean confidence - share right| per fifth, weighted) and
    log-loss; each fifth's mean confidence and share right; what is delivered
    at the threshold and how much of it is right; how short requests fare."""
    conf = np.array([c for _, c in decided])
    right = np.array([i == r.intent for r, (i, _) in zip(reqs, decided, strict=True)])
    which = np.minimum((conf * 5).astype(int), 4)
    bins = [
        f"{b / 5:.1f}+: {conf[which == b].mean():.2f}/{right[which == b].mean():.2f}"
        f" ({(which == b).sum()})"
        for b in range(5)
        if (which == b).any()
    ]
    gap = sum(
        abs(conf[which == b].mean() - right[which == b].mean()) * (which == b).sum()
        for b in range(5)
        if (which == b).any()
    ) / len(conf)
    print(f"ECE {gap:.3f}, log-loss {log_loss(reqs, decided):.3f}; confidence/share right:")
    print("  " + ", ".join(bins))
    sent, short = conf >= RECOMMENDED, np.array([words(r.text) <= SHORT for r in reqs])
    print(
        f"at {RECOMMENDED}: delivered {sent.mean():.1%} ({sent.sum()}), {right[sent].mean():.1%}"
        f" of them to the labelled intent; short requests ({short.sum()}): delivered"
        f" {(sent & short).sum()}, {(sent & short & right).sum()} to the labelled intent,"
        f" mean confidence {conf[short].mean():.2f}"
    )


def fit_pseudo(
    name: str, scorer: Scorer, cards: dict[str, IntentText], requests: list[Request]
) -> None:
    """--fit: the scorer's pseudo-count with the lowest cross-validated log-loss, and the
    calibration fitted on every request with it (what DEFAULT_CALIBRATION should be)."""
    keep, encoder = getattr(scorer, "pseudo_words", None), getattr(scorer, "encoder", None)
    if encoder is not None:  # each request embedded once, not once per pseudo-count
        scorer.encoder = _Memo(encoder)  # type: ignore[attr-defined]
    losses, at = {}, ""
    for pseudo in PSEUDO_GRID.get(name, ()) if keep is not None else ():
        scorer.pseudo_words = pseudo  # type: ignore[attr-defined]
        scorer.fit(cards)
        ranked = rank_all(scorer, requests)[0]
        losses[pseudo] = log_loss(requests, cross_validated(ranked))
    if losses:
        scorer.pseudo_words = best = min(losses, key=losses.__getitem__)  # type: ignore[attr-defined]
        scorer.fit(cards)
        tried = ", ".join(f"{c:g}: {v:.4f}" for c, v in losses.items())
        print(f"cross-validated log-loss by pseudo_words: {tried}; best {best:g}")
        at = f" at pseudo_words={best:g}"
    ranked = rank_all(scorer, requests)[0]
    print(f"calibration fitted on all requests{at}: {Calibration.fit(samples(ranked))}")
    if encoder is not None:
        scorer.encoder = encoder  # type: ignore[attr-defined]
    if losses:
        scorer.pseudo_words = keep  # type: ignore[attr-defined]
        scorer.fit(cards)


class _Memo:
    """An encoder that embeds each text once."""

    def __init__(self, encoder) -> None:  # type: ignore[no-untyped-def]
        self.encoder, self.seen = encoder, {}

    def encode(self, texts: list[str]) -> np.ndarray:
        new = [t for t in texts if t not in self.seen]
        if new:
            self.seen.update(zip(new, self.encoder.encode(new), strict=True))
        return np.stack([self.seen[t] for t in texts])


# ---------------------------------------------------------------------------- learning


def learned(
    name: str, scorer: Scorer, cards: dict[str, IntentText], requests: list[Request]
) -> None:
    """What answered manual reviews are worth when they become card examples. Per rotation:
    two folds' in-scope requests join their intent's examples, two more fit the calibration,
    the fifth is judged — so no request is judged by cards or a calibration that saw it."""
    fold = folds(requests)
    decided: list[tuple[str, float]] = [("", 0.0)] * len(requests)
    added = 0
    for f in range(FOLDS):
        teach = {(f + 1) % FOLDS, (f + 2) % FOLDS}
        calib = {(f + 3) % FOLDS, (f + 4) % FOLDS}
        grown = {
            k: IntentText(
                v.description,
                v.examples
                + tuple(
                    r.text
                    for r, k2 in zip(requests, fold, strict=True)
                    if k2 in teach and r.intent == k
                ),
            )
            for k, v in cards.items()
        }
        added += sum(len(v.examples) - len(cards[k].examples) for k, v in grown.items())
        scorer.fit(grown)
        fit_on = [
            Ranked(r, [(s.intent, s.score) for s in scorer.rank(r.text, TOP)])
            for r, k in zip(requests, fold, strict=True)
            if k in calib
        ]
        cal = Calibration.fit(samples(fit_on))
        for i, r in enumerate(requests):
            if fold[i] == f:
                top = scorer.rank(r.text, TOP)
                e, m = features([s.score for s in top])[0]
                decided[i] = (top[0].intent, cal.confidence(e, m))
    outs = [outcome(r, i, c, RECOMMENDED) for r, (i, c) in zip(requests, decided, strict=True)]
    n = len(requests)
    print(
        f"| {name} | {4 + added / FOLDS / len(cards):.0f} | {outs.count('right') / n:.1%} | "
        f"{outs.count('alt') / n:.1%} | {outs.count('wrong') / n:.1%} ({outs.count('wrong')}) | "
        f"{outs.count('manual') / n:.1%} |"
    )
    scorer.fit(cards)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scorers", default="bm25,bm25-bigram,minilm")
    parser.add_argument(
        "--fit", action="store_true", help="print calibrations fitted on all requests"
    )
    parser.add_argument("--no-scale", action="store_true", help="skip the 1,000-agent timing")
    parser.add_argument(
        "--cards", type=Path, default=DATA / "cards.json", help="your own cards (JSON)"
    )
    parser.add_argument(
        "--requests", type=Path, default=DATA / "requests.jsonl", help="your labelled requests"
    )
    args = parser.parse_args()
    configure_logging("warning", "console")
    cards, requests = load_cards(args.cards), load_requests(args.requests)
    n_zh = sum(r.lang == "zh" for r in requests)
    print(
        f"{len(requests)} requests ({n_zh} Chinese, {len(requests) - n_zh} English, "
        f"{sum(r.intent == NONE for r in requests)} out of scope, "
        f"{sum(bool(r.also) for r in requests)} ambiguous)"
        f" over {len(cards)} intents; confidences from {FOLDS}-fold cross-validated calibration"
    )
    made: dict[str, Callable[[], Scorer]] = {}
    fitted: dict[str, Scorer] = {}
    for name, make in scorers(args.scorers.split(",")).items():
        try:
            start = time.perf_counter()
            scorer = make()
            scorer.fit(cards)
            setup = time.perf_counter() - start
        except (ScorerUnavailable, ImportError) as exc:
            print(f"\n## {name}: skipped ({exc})")
            continue
        made[name] = make
        fitted[name] = scorer
        ranked, us = rank_all(scorer, requests)
        table(name, ranked, cross_validated(ranked))
        print(
            f"load + fit on {len(cards)} intents {setup * 1e3:.0f} ms;"
            f" one resolution {us:,.0f} µs (mean)"
        )
        if args.fit:
            fit_pseudo(name, scorer, cards, requests)
    print(
        f"\n## labelled requests appended as examples (at {RECOMMENDED}; the cards' 4 examples"
        " + ~40 % of the requests, judged on the rest)"
    )
    print("| scorer | examples per intent | delivered right | alt | **wrong** | manual |")
    print("|---|---|---|---|---|---|")
    for name in ("bm25", "minilm"):
        if name in fitted:
            learned(name, fitted[name], cards, requests)
    if not args.no_scale:
        print("\n## cost at 1,000 agents (synthetic cards; the 271 real requests as queries)")
        print(
            "| scorer | index | texts | ranking p50 | p99 | whole resolution p50 / p99"
            " | index build |"
        )
        print("|---|---|---|---|---|---|---|")
        for name in ("bm25", "minilm"):  # the other BM25 variants differ only in tokenizing
            if name in made:
                scale(name, made[name], cards, [r.text for r in requests])


if __name__ == "__main__":
    main()
