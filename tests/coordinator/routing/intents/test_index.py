"""The index of live intents: incremental put/remove, one refit per change, merged cards."""

from agentreach.coordinator.routing.intents.index import IntentIndex
from agentreach.coordinator.routing.intents.lexical import BM25Scorer
from agentreach.coordinator.routing.intents.types import IntentText

REFUND = IntentText(
    "Refunds for paid orders: money back to the original payment method 退款",
    ("I want my money back",),
)
RISK = IntentText(
    "Fraud review: unauthorised charges, stolen cards 盗刷", ("a charge I didn't make",)
)


def test_confident_requests_rank_first_and_out_of_scope_ones_low():
    """A request in one intent's words ranks it first with high confidence; weather does not."""
    index = IntentIndex(BM25Scorer())
    index.put("cs", {"refund_application": REFUND})
    index.put("risk", {"risk_review": RISK})
    index.refresh()
    best, runner_up = index.rank("I want my money back, refund to my payment method")
    assert best.intent == "refund_application" and best.confidence > 0.9
    assert runner_up.intent == "risk_review" and runner_up.confidence < 0.1
    assert index.rank("what is the weather like")[0].confidence < 0.3


def test_empty_index_ranks_nothing():
    """With no agent registered there is no candidate."""
    index = IntentIndex(BM25Scorer())
    index.refresh()
    assert index.rank("refund please") == []


def test_refit_happens_once_per_change_and_only_when_something_changed():
    """put/remove mark the index stale; the next refresh refits once; an unchanged card is free."""
    index = IntentIndex(BM25Scorer())
    index.put("cs", {"refund_application": REFUND})
    index.refresh()
    index.refresh()
    assert index.fits == 1
    index.put("cs", {"refund_application": REFUND})  # the same card again: nothing to do
    assert not index.stale
    index.put("risk", {"risk_review": RISK})
    index.put("risk2", {"risk_review": RISK})
    index.refresh()
    assert index.rank("stolen card charge 盗刷")[0].intent == "risk_review"
    assert index.fits == 2  # two registrations, one refit
    index.remove("risk")
    index.remove("risk2")
    index.remove("never-registered")
    index.refresh()
    assert index.rank("stolen card charge 盗刷")[0].intent == "refund_application"
    assert index.fits == 3


def test_changed_hands_over_the_intents_once_for_a_fit_elsewhere():
    """``changed`` gives the merged intents once per change, for a fit in a worker thread."""
    index = IntentIndex(BM25Scorer())
    index.put("cs", {"refund_application": REFUND})
    intents = index.changed()
    assert intents is not None and set(intents) == {"refund_application"}
    assert index.changed() is None
    index.fit(intents)
    assert index.rank("money back")[0].intent == "refund_application"


def test_cards_for_one_intent_from_several_agents_are_merged():
    """Two agents serving one intent contribute both descriptions to its texts."""
    index = IntentIndex(BM25Scorer())
    index.put("a", {"refund_application": REFUND})
    index.put("b", {"refund_application": IntentText("Price difference refunds 退差价")})
    texts = index.intents()["refund_application"].texts()
    assert REFUND.description in texts and "Price difference refunds 退差价" in texts
