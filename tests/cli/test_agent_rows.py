"""The state `reach agents` shows for an agent: its card's and its last verdict together."""

from __future__ import annotations

from agentreach.cli.agent_rows import Row, state_of
from agentreach.envelopes import AgentCard, Intent, Liveness


def _row(status: str, judged: str | None, *, judged_epoch: int = 2) -> Row:
    card = AgentCard(agent_id="a1", intents={"x": Intent()}, epoch=2, status=status)  # type: ignore[arg-type]
    verdict = None
    if judged is not None:
        verdict = Liveness(agent_id="a1", state=judged, since_ms=0, epoch=judged_epoch)  # type: ignore[arg-type]
    return Row("a1", card, verdict, None, None)


def test_a_draining_agent_that_died_during_its_drain_is_offline_not_draining_for_ever():
    """Killed while draining, it was judged OFFLINE and its work moved; `reach agents` still
    said DRAINING half a minute later (a walkthrough)."""
    assert state_of(_row("draining", "ONLINE")) == "DRAINING"
    assert state_of(_row("draining", "OFFLINE")) == "OFFLINE"
    assert state_of(_row("draining", "OFFLINE", judged_epoch=1)) == "DRAINING"  # an older life
    assert state_of(_row("stopped", "ONLINE")) == "STOPPED"
    assert state_of(_row("running", None)) == "UNKNOWN"
