"""Why a task has no route: no agent declares its topic, or those that do may not serve it."""

from __future__ import annotations

from types import SimpleNamespace

from agentreach.coordinator.routing.fleet import Fleet


def fleet_refusing(refused: dict[str, dict[str, str]]) -> Fleet:
    directory = SimpleNamespace(refused=refused)
    return Fleet(directory, None, None, None)  # type: ignore[arg-type]


def test_a_topic_nobody_declares_says_so():
    assert fleet_refusing({}).no_route("echo") == "no agent serves topic 'echo'"


def test_a_topic_only_refused_agents_declare_names_them_and_the_fix():
    """On a secured server before `reach auth push`, the agent serving `echo` is refused
    it: "no agent serves topic" read as if none did; it names who declares it, and why."""
    why = "no intent allowance for agent-a (an operator runs `reach auth allow agent-a …`)"
    refused = {"agent-a": {"echo": why}, "agent-b": {"other": why}}
    said = fleet_refusing(refused).no_route("echo")
    assert (
        said
        == f"no agent serves topic 'echo': declared by agent-a, not allowed it (agent-a: {why})"
    )


def test_each_refused_agent_is_named_with_its_own_reason():
    """Two agents refused: only the first one's reason was given, for both."""
    refused = {
        "evil": {"summarize": "not allowed by its credentials (it may serve: translate)"},
        "summarizer-1": {"summarize": "no intent allowance for summarizer-1"},
    }
    assert fleet_refusing(refused).no_route("summarize") == (
        "no agent serves topic 'summarize': declared by evil, summarizer-1, not allowed it"
        " (evil: not allowed by its credentials (it may serve: translate); summarizer-1: no"
        " intent allowance for summarizer-1)"
    )
