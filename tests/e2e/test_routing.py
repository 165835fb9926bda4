"""Routing through a real server: rules, weighted splits, canaries, tags, liveness, reloads."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec
import pytest
from structlog.testing import capture_logs

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, Rejected, TaskContext
from agentreach.coordinator import QueueConfig
from agentreach.envelopes import Liveness
from agentreach.envelopes.described import described
from agentreach.envelopes.headers import task_headers
from tests.e2e.routing_support import (
    all_completed,
    fast,
    publish_many,
    routed,
    serving,
    table,
    worker,
)
from tests.support import eventually, put_value

ROOMY = QueueConfig(capacity={"P1": 5000})  # no watermark may shift a split in these tests

SPLIT = """
rules:
  - name: ab-test
    match: {topic: work}
    to:
      split:
        - {weight: 80, name: a, to: {tags: "pool=a"}}
        - {weight: 20, name: b, to: {tags: "pool=b"}}
  - {name: fallback, fallback: true, to: {dlq: no_route}}
"""


async def test_weighted_split_holds_80_20_over_1000_tasks(broker, start_coordinator, watcher):
    """An 80/20 split sends 80 % ± 5 % of 1,000 tasks to pool a."""
    counts: Counter[str] = Counter()
    fleet = [
        worker("a1", counts, tags={"pool": "a"}),
        worker("a2", counts, tags={"pool": "a"}),
        worker("b1", counts, tags={"pool": "b"}),
    ]
    config = fast(routing=table(SPLIT), queues=ROOMY)
    async with start_coordinator(config) as coordinator, serving(broker, coordinator, *fleet):
        async with ReachClient(broker=broker) as client:
            ids = await publish_many(client, "work", 1000)
        await all_completed(watcher, ids)
    share_a = (counts["a1"] + counts["a2"]) / 1000
    assert 0.75 <= share_a <= 0.85, counts
    assert counts["a1"] > 0 and counts["a2"] > 0  # both agents of pool a took work
    decisions = routed(watcher, ids)
    assert {e.detail["rule"] for e in decisions} == {"ab-test"}
    assert Counter(e.detail["pool"] for e in decisions)["a"] == counts["a1"] + counts["a2"]


async def test_canary_takes_its_percentage(broker, start_coordinator, watcher):
    """A 5 % canary to version=2.2 gets 5 % of 1,000 tasks, within binomial tolerance."""
    counts: Counter[str] = Counter()
    fleet = [
        worker("stable-1", counts, tags={"version": "2.1"}),
        worker("stable-2", counts, tags={"version": "2.1"}),
        worker("canary-1", counts, tags={"version": "2.2"}),
    ]
    rules = table("""
rules:
  - {name: canary, fallback: true, to: {canary: {percent: 5, tags: "version=2.2"}}}
""")
    config = fast(routing=rules, queues=ROOMY)
    async with start_coordinator(config) as coordinator, serving(broker, coordinator, *fleet):
        async with ReachClient(broker=broker) as client:
            ids = await publish_many(client, "work", 1000)
        await all_completed(watcher, ids)
    # 5 % of 1,000 is 50 with a standard deviation of 6.9: 25 to 75 is over 3.5 sigma.
    assert 25 <= counts["canary-1"] <= 75, counts
    assert counts["stable-1"] + counts["stable-2"] == 1000 - counts["canary-1"]


async def test_tag_selector_and_field_rules_choose_the_destination(
    broker, start_coordinator, watcher
):
    """Header and payload conditions pick the rule; its tags or intent pick the agents."""
    counts: Counter[str] = Counter()
    fleet = [
        worker("east-worker", counts, tags={"role": "worker", "region": "cn-east"}),
        worker("north-worker", counts, tags={"role": "worker", "region": "cn-north"}),
        worker("east-manager", counts, tags={"role": "manager", "region": "cn-east"}),
        worker("reviewer", counts, topics=("manual_review",)),
    ]
    rules = table("""
min_confidence: 0.5
rules:
  - name: big-to-review
    match: {topic: work, where: [{field: payload.amount, op: ">=", value: 1000}]}
    to: {intent: manual_review}
  - name: guess
    confidence: 0.2
    match: {topic: work}
    to: {agent: north-worker}
  - name: east
    match: {topic: work, where: [{field: header.X-Region, op: in, value: [cn-east]}]}
    to: {tags: "role=worker, region=cn-east"}
  - {name: fallback, fallback: true, to: {dlq: no_route}}
""")
    async with (
        start_coordinator(fast(routing=rules)) as coordinator,
        serving(broker, coordinator, *fleet),
        ReachClient(broker=broker) as client,
    ):
        plain, _ = await client.publish("work", {"i": 0})
        region = {"X-Region": "cn-east"}
        east = await publish_many(client, "work", 20, headers=region)
        big = await client.invoke("work", {"amount": 5000})
        await all_completed(watcher, east)
        unmatched = await watcher.dead_letter("no_route", message_id=plain)
    assert big == {"by": "reviewer"}
    assert counts["east-worker"] == 20 and counts["north-worker"] == 0
    assert counts["east-manager"] == 0
    assert {e.detail["rule"] for e in routed(watcher, east)} == {"east"}
    assert unmatched.error is not None
    assert "rule 'fallback'" in unmatched.error.message  # the low-confidence guess was skipped
    review = next(e for e in routed(watcher) if e.detail["rule"] == "big-to-review")
    assert review.topic == "manual_review" and review.agent_id == "reviewer"


async def test_a_rule_a_value_of_another_type_passed_over_is_said_in_the_trace_and_log(
    broker, start_coordinator, watcher
):
    """`{"amount": "5000"}` (a string) against `payload.amount >= 1000` went to the fallback
    saying `rule fallback`, with nothing to say the big-refunds rule was passed over for
    want of a comparison (a fresh operator's trial)."""
    counts: Counter[str] = Counter()
    fleet = [worker("typed-worker", counts), worker("typed-reviewer", counts, topics=("review",))]
    rules = table("""
rules:
  - name: big-to-review
    match: {topic: work, where: [{field: payload.amount, op: ">=", value: 1000}]}
    to: {intent: review}
  - {name: fallback, fallback: true, to: {}}
""")
    async with (
        start_coordinator(fast(routing=rules)) as coordinator,
        serving(broker, coordinator, *fleet),
        ReachClient(broker=broker) as client,
    ):
        with capture_logs() as logs:
            as_text = await client.invoke("work", {"amount": "5000"})
        as_number = await client.invoke("work", {"amount": 5000})
    assert as_text == {"by": "typed-worker"} and as_number == {"by": "typed-reviewer"}
    first, second = routed(watcher)
    why = "payload.amount is '5000' (string), not compared with 1000 (number) by >="
    assert first.detail["rule"] == "fallback"
    assert first.detail["rules_not_compared"] == {"big-to-review": why}
    assert "rules_not_compared" not in second.detail
    assert f"; rule big-to-review not taken: {why}" in described(first)
    [said] = [e for e in logs if e["event"].startswith("a rule passed a task over")]
    assert said["rule"] == "big-to-review" and said["why"] == why


async def test_a_suspect_agent_gets_nothing_and_a_split_shifts_back(
    broker, start_coordinator, watcher
):
    """A SUSPECT agent gets no task; its split's share moves to the other pool until it is
    ONLINE again, and the routed event says why it was passed over."""
    counts: Counter[str] = Counter()
    fleet = [worker("a1", counts, tags={"pool": "a"}), worker("b1", counts, tags={"pool": "b"})]
    halves = SPLIT.replace("weight: 80", "weight: 50").replace("weight: 20", "weight: 50")
    config = fast(routing=table(halves), queues=ROOMY)
    async with (
        start_coordinator(config) as coordinator,
        serving(broker, coordinator, *fleet),
        ReachClient(broker=broker) as client,
    ):
        card = coordinator.directory.cards["a1"]
        liveness = broker.names.liveness_bucket
        suspect = Liveness(
            agent_id="a1", state="SUSPECT", since_ms=1, reason="unresponsive", epoch=card.epoch
        )
        await put_value(broker, liveness, "a1", envelopes.encode(suspect))
        await eventually(lambda: not coordinator.directory.can_take_work(card))
        during = await publish_many(client, "work", 100)
        await all_completed(watcher, during)
        assert counts["a1"] == 0 and counts["b1"] == 100
        online = Liveness(agent_id="a1", state="ONLINE", since_ms=2, epoch=card.epoch)
        await put_value(broker, liveness, "a1", envelopes.encode(online))
        await eventually(lambda: coordinator.directory.can_take_work(card))
        after = await publish_many(client, "work", 100)
        await all_completed(watcher, after)
    assert counts["a1"] > 25  # back to about half
    passed = routed(watcher, during)[0].detail["passed_over"]
    assert passed == {"a1": "agent SUSPECT"}


RELOADABLE = """
routing:
  rules:
    - name: {name}
      match: {{topic: work}}
      to: {{tags: "pool={pool}"}}
    - {{name: fallback, fallback: true, to: {{dlq: no_route}}}}
"""


async def test_reload_mid_traffic_loses_nothing(broker, start_coordinator, watcher, tmp_path):
    """Rules reloaded (on request, then on a file change) while tasks flow: every task
    completes once, the later ones by the new rule."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(RELOADABLE.format(name="to-a", pool="a"))
    from agentreach.coordinator import load_config

    routing = msgspec.structs.replace(load_config(path).routing, reload_poll_s=0.05)
    config = fast(routing=routing, queues=ROOMY)
    counts: Counter[str] = Counter()
    fleet = [worker("a1", counts, tags={"pool": "a"}), worker("b1", counts, tags={"pool": "b"})]
    async with (
        start_coordinator(config, path) as coordinator,
        serving(broker, coordinator, *fleet),
        ReachClient(broker=broker) as client,
    ):
        first = await publish_many(client, "work", 300)
        await watcher.until(lambda: watcher.count("completed", first) >= 50 or None, "50 done")
        path.write_text(RELOADABLE.format(name="to-b", pool="b"))
        answer = await broker.nc.request(broker.names.routes_reload, b"", timeout=5)
        assert b'"ok":true' in answer.data and b"to-b" in answer.data
        second = await publish_many(client, "work", 300)
        await watcher.until(
            lambda: any(e.detail["rule"] == "to-b" for e in routed(watcher)) or None, "to-b used"
        )
        path.write_text(RELOADABLE.format(name="back-to-a", pool="a"))
        await eventually(lambda: coordinator.router.routing.rules[0].name == "back-to-a")
        third = await publish_many(client, "work", 100)
        await all_completed(watcher, first | second | third)
    everything = first | second | third
    assert watcher.count("completed", everything) == 700  # each once, none lost
    assert not [d for d in watcher.dead_letters if d.message_id in everything]
    # Tasks still in intake at a reload are routed by the new rules.
    assert "to-a" in {e.detail["rule"] for e in routed(watcher, first)}
    assert {e.detail["rule"] for e in routed(watcher, second)} <= {"to-b", "back-to-a"}
    assert {e.detail["rule"] for e in routed(watcher, third)} == {"back-to-a"}
    assert all(
        e.agent_id == {"to-a": "a1", "to-b": "b1", "back-to-a": "a1"}[e.detail["rule"]]
        for e in routed(watcher, everything)
    )
    assert counts["b1"] > 0 and counts["a1"] + counts["b1"] == 700


async def test_a_bad_file_keeps_the_rules_in_use(broker, start_coordinator, tmp_path):
    """A reload of a file without a fallback is refused with the path of the mistake."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(RELOADABLE.format(name="to-a", pool="a"))
    async with start_coordinator(fast(), path) as coordinator:
        path.write_text("routing:\n  rules:\n    - {name: x, to: {intent: y}}\n")
        answer = await broker.nc.request(broker.names.routes_reload, b"", timeout=5)
        assert b'"ok":false' in answer.data
        assert b"the last rule must be the fallback" in answer.data
        assert b"$.routing" in answer.data
        assert [r.name for r in coordinator.router.routing.rules] == ["default"]


async def test_agent_pools_skip_those_not_serving_the_intent(broker, start_coordinator):
    """An agent named by a rule but not serving the topic is not a destination."""
    other = Agent("other", startup_delay=0)

    @other.handler("elsewhere")
    async def elsewhere(ctx: TaskContext, payload: object) -> str:
        return "no"

    rules = table("""
rules:
  - {name: pinned, match: {topic: work}, to: {agent: other}}
  - {name: fallback, fallback: true, to: {dlq: no_route}}
""")
    async with (
        start_coordinator(fast(routing=rules)) as coordinator,
        serving(broker, coordinator, other),
        ReachClient(broker=broker) as client,
    ):
        with pytest.raises(Rejected) as caught:
            await client.invoke("work", {})
    assert caught.value.reason == "no_route"
    assert caught.value.ending == "no_route"


async def test_one_agent_destination_and_the_less_loaded_of_two(broker, start_coordinator, watcher):
    """`to: {agent: X}` sends every task to X; in a pool, the agent with the shorter queue
    gets the work (power of two choices on queue depth)."""
    counts: Counter[str] = Counter()
    gate = asyncio.Event()
    busy = Agent("busy", startup_delay=0)

    @busy.handler("work", capacity=10)
    async def held(ctx: TaskContext, payload: dict) -> dict:
        if payload.get("hold"):
            await gate.wait()
        counts["busy"] += 1
        return {"by": "busy"}

    rules = table("""
rules:
  - {name: pinned, match: {topic: pinned}, to: {agent: idle, intent: work}}
  - {name: fallback, fallback: true, to: {}}
""")
    async with (
        start_coordinator(fast(routing=rules)) as coordinator,
        serving(broker, coordinator, busy, worker("idle", counts)),
        ReachClient(broker=broker) as client,
    ):
        pinned = await publish_many(client, "pinned", 10)
        await all_completed(watcher, pinned)
        for _ in range(5):  # five held tasks queued straight at busy (P1 cap is 200)
            hold = client.task("work", {"hold": True})
            hold = msgspec.structs.replace(hold, to_agent="busy")
            subject = broker.names.dispatch("busy", "P1")
            await broker.publish(subject, envelopes.encode(hold), headers=task_headers(hold))
        await eventually(lambda: coordinator.queues.depth("busy", "P1") >= 5)
        light = [await client.invoke("work", {}) for _ in range(20)]
        gate.set()
    assert {e.agent_id for e in routed(watcher, pinned)} == {"idle"}
    assert light.count({"by": "idle"}) >= 18, light


async def test_a_reload_says_which_changed_sections_wait_for_a_restart(
    broker, start_coordinator, tmp_path
):
    """The file's workflows and liveness edited too: the rules are reloaded, the rest is
    not, and the reload says so, naming those sections (it said only "routing rules
    loaded", and a workflow edit looked applied until the next restart)."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(RELOADABLE.format(name="to-a", pool="a"))
    async with start_coordinator(fast(), path) as coordinator:
        edited = RELOADABLE.format(name="to-b", pool="b") + (
            "workflows:\n  flow: {chain: [{name: one, intent: work}]}\nliveness: {tick_s: 2.0}\n"
        )
        path.write_text(edited)
        with capture_logs() as logs:
            answer = await broker.nc.request(broker.names.routes_reload, b"", timeout=5)
        assert b'"ok":true' in answer.data
        assert [r.name for r in coordinator.router.routing.rules] == ["to-b", "fallback"]
        assert "flow" not in coordinator.workflows.specs
    said = [e for e in logs if e["event"].startswith("the config file changed sections")]
    assert [e["sections"] for e in said] == [["liveness", "workflows"]]


async def test_a_file_emptied_on_the_way_to_a_reload_keeps_the_rules(
    broker, start_coordinator, tmp_path
):
    """A file truncated by a non-atomic save was read as the defaults: every rule replaced by
    a fallback, and a topic only a rule served dead-lettered `no_route` (a trial)."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(RELOADABLE.format(name="to-a", pool="a"))
    async with start_coordinator(fast(), path) as coordinator:
        loaded = await broker.nc.request(broker.names.routes_reload, b"", timeout=5)
        assert b'"ok":true' in loaded.data, loaded.data
        path.write_text("")
        answer = await broker.nc.request(broker.names.routes_reload, b"", timeout=5)
        assert b'"ok":false' in answer.data and b"holds no settings" in answer.data, answer.data
        assert [r.name for r in coordinator.router.routing.rules] == ["to-a", "fallback"]


async def test_the_less_loaded_of_two_is_judged_per_slot(broker, start_coordinator, watcher):
    """An agent of 1 slot beside one of 8: by queue depth alone the small one, running its
    one task, was as loaded as the large one running one, and was picked half the time; its
    tasks queued behind, and invokes timed out unacknowledged (a walkthrough, 2.5 %). Per
    slot, the large one takes nearly all while the small one is busy."""
    gate = asyncio.Event()
    runs: Counter[str] = Counter()

    def held(agent_id: str, capacity: int) -> Agent:
        agent = Agent(agent_id, startup_delay=0)

        @agent.handler("slow", capacity=capacity)
        async def hold(ctx: TaskContext, payload: dict) -> dict:
            runs[agent_id] += 1
            await gate.wait()
            return {"by": agent_id}

        return agent

    async with (
        start_coordinator(fast()) as coordinator,
        serving(broker, coordinator, held("small", 1), held("large", 8)),
        ReachClient(broker=broker) as client,
    ):
        sent = await publish_many(client, "slow", 8)
        await eventually(lambda: sum(runs.values()) >= 7, timeout=10)
        queued_small = coordinator.queues.depth("small", "P1")
        gate.set()
        await all_completed(watcher, sent)
    assert queued_small <= 2, runs  # by depth alone: about 4 of the 8


async def test_a_message_that_asks_for_no_answer_reloads_nothing(
    broker, start_coordinator, tmp_path, monkeypatch
):
    """An agent's `+WPI` on an ack subject with its reply aimed at the reload subject has the
    server send an empty message there, with no headers and no reply: every replica
    reloaded its config once per message, at 430 a second (a security re-test)."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(RELOADABLE.format(name="to-a", pool="a"))
    async with start_coordinator(fast(), path) as coordinator:
        reloads: list[object] = []
        reload = coordinator.routes.reload
        monkeypatch.setattr(coordinator.routes, "reload", lambda: reloads.append(1) or reload())
        for _ in range(3):
            await broker.nc.publish(broker.names.routes_reload, b"")
        # Handled in order on the one subscription: the three came first.
        answer = await broker.nc.request(broker.names.routes_reload, b"", timeout=5)
    assert b'"ok":true' in answer.data
    assert len(reloads) == 1
