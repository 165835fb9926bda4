from collections import Counter

from tests.coordinator.routing.intents.labelled import NONE, load_cards, load_requests


def test_labelled_set_is_large_bilingual_and_covers_every_intent():
    """≥ 200 requests, ≥ 10 intents of ≥ 20 requests each, half Chinese, some out of scope."""
    cards, requests = load_cards(), load_requests()
    counts = Counter(r.intent for r in requests)
    assert len(requests) >= 200 and len(cards) >= 10
    assert all(counts[name] >= 20 for name in cards)
    assert set(counts) == set(cards) | {NONE} and counts[NONE] >= 20
    zh = sum(r.lang == "zh" for r in requests) / len(requests)
    assert 0.4 <= zh <= 0.6


def test_cards_look_like_registrations_and_do_not_leak_into_the_requests():
    """Each card has a description and 3 to 5 examples; no request repeats an example or
    another request."""
    cards, requests = load_cards(), load_requests()
    assert all(c.description and 3 <= len(c.examples) <= 5 for c in cards.values())
    examples = {e for c in cards.values() for e in c.examples}
    texts = [r.text for r in requests]
    assert not examples & set(texts) and len(set(texts)) == len(texts)
    assert all(set(r.also) <= set(cards) and r.intent not in r.also for r in requests)
