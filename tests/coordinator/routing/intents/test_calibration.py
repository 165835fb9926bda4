import math

import numpy as np
import pytest

from agentreach.coordinator.routing.intents.calibration import (
    Calibration,
    features,
    ranked,
    said,
    words,
)


def test_confidence_stays_within_0_and_1_even_for_extreme_inputs():
    """Any evidence, however large or negative, maps into [0, 1] without overflow."""
    cal = Calibration(bias=-2.0, evidence=5.0, margin=8.0)
    for e, m in [(0, 0), (1e9, 1e9), (-1e9, -1e9), (0.5, -0.5), (float("1e308"), 0)]:
        assert 0.0 <= cal.confidence(e, m) <= 1.0


def test_confidence_rises_with_evidence_and_with_margin():
    """More evidence or a wider lead over the runner-up never lowers the confidence."""
    cal = Calibration(bias=-1.8, evidence=4.9, margin=7.5)
    grid = [i / 10 for i in range(-10, 16)]
    for m in grid:
        values = [cal.confidence(e, m) for e in grid]
        assert values == sorted(values)
    for e in grid:
        values = [cal.confidence(e, m) for m in grid]
        assert values == sorted(values)


def test_fit_recovers_a_separable_signal_and_keeps_weights_non_negative():
    """Right candidates with high evidence are fitted to high confidence; weights stay >= 0."""
    samples = (
        [(0.9, 0.5, True)] * 30
        + [(0.2, -0.4, False)] * 30
        + [(0.5, 0.0, True), (0.5, 0.0, False)] * 5
    )
    cal = Calibration.fit(samples)
    assert cal.evidence >= 0 and cal.margin >= 0
    assert cal.confidence(0.9, 0.5) > 0.9 > 0.1 > cal.confidence(0.2, -0.4)
    assert cal.confidence(0.5, 0.0) == pytest.approx(0.5, abs=0.15)


def test_fit_clamps_a_weight_that_the_data_would_make_negative():
    """If evidence anti-correlates with being right, its weight is held at 0, not negative."""
    samples = [(0.1, 0.6, True)] * 20 + [(0.9, -0.2, False)] * 20
    cal = Calibration.fit(samples)
    assert cal.evidence == 0.0 and cal.margin > 0


def test_fit_refuses_samples_of_one_class():
    """Calibration needs both right and wrong candidates."""
    with pytest.raises(ValueError, match="both right and wrong"):
        Calibration.fit([(0.5, 0.1, True)] * 3)


def test_features_give_the_top_its_lead_and_the_others_their_gap():
    """The top's margin is over the runner-up; the others' margins are negative gaps to the top."""
    assert features([0.8, 0.5, 0.1]) == [
        (0.8, pytest.approx(0.3)),
        (0.5, pytest.approx(-0.3)),
        (0.1, pytest.approx(-0.7)),
    ]
    assert features([0.4]) == [(0.4, 0.4)]
    assert features([]) == []


def test_ranked_breaks_ties_by_name_and_handles_no_candidates():
    """Equal evidence ranks alphabetically (names are sorted), and no intent gives []."""
    cal = Calibration(bias=0.0, evidence=1.0, margin=1.0)
    out = ranked(["a", "b", "c"], np.array([0.5, 0.5, 0.9]), cal, 3)
    assert [s.intent for s in out] == ["c", "a", "b"]
    assert ranked([], np.zeros(0), cal, 3) == []
    assert math.isclose(out[0].score, 0.9)


def test_words_count_latin_words_and_chinese_characters_at_one_and_a_half_each():
    """A request's length in words, for English and Chinese alike."""
    assert words("I want my money back") == 5
    assert words("退款") == pytest.approx(2 / 1.5)
    assert words("申请退款 order 1234") == pytest.approx(4 / 1.5 + 2)
    assert words("") == 0 and words("!!! ...") == 0


def test_said_weighs_evidence_by_how_much_the_request_says():
    """n words keep n / (n + pseudo_words) of their evidence; without a pseudo-count, all."""
    assert said("money", 8) == pytest.approx(1 / 9)
    assert said("a b c d e f g h", 8) == pytest.approx(0.5)
    assert said("money", 0) == said("", 0) == 1.0
    assert said("", 8) == 0.0
