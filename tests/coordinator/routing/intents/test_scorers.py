"""Behaviour every scorer shares, run against each of them."""

import hashlib
import itertools
from collections.abc import Callable

import numpy as np
import pytest

from agentreach.coordinator.routing.intents.calibration import said
from agentreach.coordinator.routing.intents.embedding import EmbeddingScorer
from agentreach.coordinator.routing.intents.lexical import BM25Scorer
from agentreach.coordinator.routing.intents.types import IntentText, Scorer
from tests.coordinator.routing.intents.labelled import NONE, load_requests


class HashEncoder:
    """A fast, deterministic stand-in for the model: hashed character bigrams, normalised."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += texts
        out = np.zeros((len(texts), 256), np.float32)
        for row, text in enumerate(texts):
            for a, b in itertools.pairwise(text):
                out[row, hashlib.blake2b((a + b).encode(), digest_size=1).digest()[0]] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


SCORERS: dict[str, Callable[[], Scorer]] = {
    "bm25": lambda: BM25Scorer(),
    "embedding(hash)": lambda: EmbeddingScorer(encoder=HashEncoder()),
}


@pytest.fixture(params=sorted(SCORERS))
def scorer(request, cards) -> Scorer:
    s = SCORERS[request.param]()
    s.fit(cards)
    return s


def test_confidences_are_probabilities_best_first(scorer):
    """Every candidate's confidence is within [0, 1], and the list is sorted best first."""
    for r in load_requests()[::3]:
        ranked = scorer.rank(r.text, k=5)
        assert len(ranked) == 5
        assert all(0.0 <= s.confidence <= 1.0 for s in ranked)
        assert [s.confidence for s in ranked] == sorted(
            (s.confidence for s in ranked), reverse=True
        )


def test_runner_up_is_never_more_confident_than_the_best(scorer):
    """The second candidate's confidence is at most the first's, whatever the text."""
    for text in ["refund", "退款", "", "zzz", "refund complaint fraud 盗刷 投诉"]:
        ranked = scorer.rank(text, k=2)
        assert ranked[0].confidence >= ranked[1].confidence


def test_no_intents_means_no_candidates(scorer):
    """Fitted on nothing, a scorer ranks nothing (and does not raise)."""
    scorer.fit({})
    assert scorer.rank("I want a refund") == []


def test_intents_without_usable_text_rank_at_zero():
    """An intent whose texts have no token still appears, with no evidence."""
    s = BM25Scorer()
    s.fit({"a": IntentText("refund money"), "b": IntentText("!!! ...")})
    ranked = s.rank("refund")
    assert [x.intent for x in ranked] == ["a", "b"] and ranked[1].score == 0.0


def test_results_are_deterministic_and_independent_of_input_order(cards):
    """Two scorers fitted on the same intents in another order rank identically, twice."""
    for make in SCORERS.values():
        a, b = make(), make()
        a.fit(cards)
        b.fit(dict(reversed(list(cards.items()))))
        for r in load_requests()[::7]:
            assert a.rank(r.text) == b.rank(r.text) == a.rank(r.text)


def test_bm25_confidence_grows_with_matched_words(cards):
    """Replacing an intent's words with unknown ones, one at a time, lowers its confidence."""
    s = BM25Scorer()
    s.fit(cards)
    words = ["refund", "money", "back", "damaged", "returned"]
    confidences = []
    for unknown in range(len(words) + 1):
        text = " ".join(words[: len(words) - unknown] + [f"qqq{i}" for i in range(unknown)])
        confidences.append(
            {x.intent: x.confidence for x in s.rank(text, k=11)}["refund_application"]
        )
    assert (
        confidences == sorted(confidences, reverse=True)
        and confidences[0] > 0.9 > 0.2 > confidences[-1]
    )


def test_bm25_resolves_chinese_requests(cards):
    """Chinese requests match Chinese card text (no spaces needed); most land on their intent."""
    s = BM25Scorer()
    s.fit(cards)
    assert s.rank("我的信用卡被人盗刷了")[0].intent == "risk_review"
    assert s.rank("发票抬头错了，帮我重开一张")[0].intent == "invoice_request"
    zh = [r for r in load_requests() if r.lang == "zh" and r.intent != NONE]
    right = sum(s.rank(r.text, k=1)[0].intent == r.intent for r in zh)
    assert right / len(zh) > 0.65


# Each word is in refund_application's examples ("I want my money back for order 1234", "The
# blender arrived broken, please refund me", "申请退款..."); each was 0.95-1.0.
BARE_WORDS = ["money", "blender", "refund", "退款"]
FULL_REFUND = "The blender I ordered arrived broken, I want my money back"


@pytest.mark.parametrize("word", BARE_WORDS)
def test_bm25_is_not_sure_of_a_bare_word_that_one_example_contains(cards, word):
    """A one-word request resolves to the intent whose example has the word, but below the
    delivery threshold (0.75); a full request for the same intent stays above it."""
    s = BM25Scorer()
    s.fit(cards)
    bare, full = s.rank(word, k=1)[0], s.rank(FULL_REFUND, k=1)[0]
    assert bare.intent == full.intent == "refund_application"
    assert bare.confidence < 0.75 <= full.confidence


def test_bm25_evidence_grows_with_what_the_request_says():
    """The share of a request an intent explains is weighed by how much the request says, so a
    bare word that the intent explains has less evidence than a sentence it explains."""
    intents = {"a": IntentText("money back refund order"), "b": IntentText("password reset")}
    s, unweighed = BM25Scorer(), BM25Scorer(pseudo_words=0)
    s.fit(intents)
    unweighed.fit(intents)
    for text in ("money", "money back refund order"):
        weight = said(text, s.pseudo_words)
        assert s.evidence(text) == pytest.approx(unweighed.evidence(text) * weight)
    assert s.evidence("money")[0] < 0.12 < 0.25 < s.evidence("money back refund order")[0]


def test_out_of_scope_requests_get_low_confidence(cards):
    """Requests about nothing any agent does stay well below the default threshold."""
    s = BM25Scorer()
    s.fit(cards)
    for text in ["What's the weather tomorrow?", "明天天气怎么样", "tell me a joke", ""]:
        assert s.rank(text)[0].confidence < 0.3


def test_bm25_refit_tokenizes_only_new_texts(cards):
    """A refit after one intent changed tokenizes that intent's new text and nothing else."""
    seen: list[str] = []
    s = BM25Scorer()
    inner = s.tokenizer
    s.tokenizer = lambda text: seen.append(text) or inner(text)  # type: ignore[assignment]
    s.fit(cards)
    first = len(seen)
    seen.clear()
    changed = dict(cards) | {"gift_card": IntentText("Gift cards: balance, activation 礼品卡余额")}
    s.fit(changed)
    assert seen == ["Gift cards: balance, activation 礼品卡余额"] and first > 40
    assert s.rank("礼品卡余额怎么查")[0].intent == "gift_card"
    s.fit(cards)
    assert "gift_card" not in {x.intent for x in s.rank("礼品卡余额怎么查", k=20)}


def test_embedding_refit_embeds_only_new_texts(cards):
    """The embeddings scorer caches vectors: a refit embeds only texts it has not seen."""
    enc = HashEncoder()
    s = EmbeddingScorer(encoder=enc)
    s.fit(cards)
    enc.calls.clear()
    s.fit(dict(cards) | {"gift_card": IntentText("Gift card balance")})
    assert enc.calls == ["Gift card balance"]
    assert s.rank("gift card balance")[0].intent == "gift_card"


def test_embedding_evidence_of_a_copied_example_is_weighed_by_its_length():
    """A request that repeats an example word for word has cosine 1 with it; its evidence is
    that cosine weighed by how much it says, so a copied bare word is weak evidence."""
    s = EmbeddingScorer(encoder=HashEncoder())
    long = "The blender I ordered arrived broken and I want my money back"
    s.fit({"a": IntentText("refunds", ("blender", long)), "b": IntentText("password reset")})
    assert s.evidence("blender")[0] == pytest.approx(said("blender", s.pseudo_words))
    assert s.evidence(long)[0] == pytest.approx(said(long, s.pseudo_words))
    assert s.evidence("blender")[0] < 0.5 < s.evidence(long)[0]


def test_real_minilm_is_not_sure_of_a_bare_word_from_an_example(cards, minilm):
    """With the bundled model, "blender" (a word of one refund example, not a request) stays
    below the delivery threshold; a full refund request does not."""
    s = EmbeddingScorer(encoder=minilm)
    s.fit(cards)
    bare, full = s.rank("blender", k=1)[0], s.rank(FULL_REFUND, k=1)[0]
    assert full.intent == "refund_application" and bare.confidence < 0.75 <= full.confidence


def test_real_minilm_resolves_english_and_stays_calibrated(cards, minilm):
    """With the bundled model: English paraphrases resolve; confidences stay in [0, 1]."""
    s = EmbeddingScorer(encoder=minilm)
    s.fit(cards)
    assert s.rank("I can't log in, I forgot my password")[0].intent == "account_security"
    assert s.rank("Where is my parcel right now?")[0].intent == "order_status"
    assert all(0 <= x.confidence <= 1 for x in s.rank("天气怎么样", k=11))
