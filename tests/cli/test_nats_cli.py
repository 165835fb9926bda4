"""Operators use the real `nats` CLI; what it sends and shows must work with Agent-Reach."""

from __future__ import annotations

import pytest

from agentreach.agents import Agent, TaskContext
from agentreach.coordinator.workflows import read_record
from tests.cli.conftest import run, run_in_terminal

pytestmark = pytest.mark.nats_cli


async def nats_pub(nats_cli, broker, topic: str, body: str, *headers: str, js: bool = False):  # type: ignore[no-untyped-def]
    """`nats pub [-J] reach.task.<topic> BODY -H Name:value ...`, as an operator types it."""
    flags = [arg for header in headers for arg in ("-H", header)] + (["-J"] if js else [])
    return await run(
        nats_cli, "--server", broker.url, "pub", broker.names.task(topic), body, *flags
    )


def summarizer() -> Agent:
    agent = Agent("cli-worker", tags={"role": "worker"}, startup_delay=0)

    @agent.handler("summarize")
    async def summarize(ctx: TaskContext, payload: dict) -> dict:
        return {"words": len(payload["text"].split())}

    return agent


async def test_nats_pub_reaches_an_agent(nats_cli, broker, coordinator, watcher):
    """`nats pub -J reach.task.<topic> '<json>'` with a trace header (the README's first
    task) is stored, says so, and is executed by an agent."""
    async with summarizer().running(broker=broker):
        done = await nats_pub(
            nats_cli,
            broker,
            "summarize",
            '{"text": "three little words"}',
            "Reach-Trace-Id:from-cli",
            js=True,
        )
        assert done.returncode == 0, done.stderr
        assert f"Stored in Stream: {broker.names.tasks_stream}" in done.stdout + done.stderr
        completed = await watcher.event("completed", topic="summarize")
    assert completed.trace_id == "from-cli"
    assert completed.detail["result"] == {"words": 3}


async def test_nats_stream_view_shows_dead_letters(nats_cli, broker, coordinator, watcher):
    """`nats stream view REACH_DLQ` shows an invalid body's dead letter with its reason."""
    sent = await nats_pub(nats_cli, broker, "summarize", '{"text": ', "Nats-Msg-Id:broken-1")
    assert sent.returncode == 0, sent.stderr
    await watcher.dead_letter("invalid_envelope")
    stream = broker.names.dlq_stream
    shown = await run_in_terminal(nats_cli, "--server", broker.url, "stream", "view", stream)
    assert broker.names.dlq("invalid_envelope", "summarize") in shown.stdout
    assert '"message_id":"broken-1"' in shown.stdout
    assert "JSON is malformed: truncated (the body ends before the value does)" in shown.stdout


async def test_nats_kv_ls_lists_registered_agents(nats_cli, broker):
    """`nats kv ls reach_agents` lists an agent once it is serving."""
    async with summarizer().running(broker=broker):
        bucket = broker.names.agents_bucket
        listed = await run(nats_cli, "--server", broker.url, "kv", "ls", bucket)
    assert listed.returncode == 0, listed.stderr
    assert "cli-worker" in listed.stdout.split()


async def test_nats_micro_ls_lists_live_agents(nats_cli, broker):
    """`nats micro ls` shows each live agent as a reach-agent service instance, asked as the
    README says (on a secured server an agent may answer only under `_INBOX_probe`)."""
    probe_inbox = ("--inbox-prefix", "_INBOX_probe.admin")
    async with summarizer().running(broker=broker):
        listed = await run(nats_cli, "--server", broker.url, *probe_inbox, "micro", "ls")
    assert listed.returncode == 0, listed.stderr
    assert "reach-agent" in listed.stdout


async def test_nats_pub_headers_steer_routing_rules(nats_cli, broker, start_coordinator, watcher):
    """A header set with `nats pub -H` is matched by a rule (`header.<Name>`)."""
    import msgspec

    from agentreach.coordinator import CoordinatorConfig
    from agentreach.coordinator.routing.rules import RoutingConfig

    rules = msgspec.yaml.decode(
        b"""
rules:
  - name: by-header
    match: {where: [{field: header.X-Lane, op: "==", value: express}]}
    to: {intent: express}
  - {name: fallback, fallback: true, to: {}}
""",
        type=RoutingConfig,
    )
    express = Agent("cli-express", startup_delay=0)

    @express.handler("express")
    async def fast_lane(ctx: TaskContext, payload: dict) -> str:
        return "express"

    async with (
        start_coordinator(CoordinatorConfig(routing=rules)),
        summarizer().running(broker=broker),
        express.running(broker=broker),
    ):
        body = '{"text": "a b"}'
        steered = await nats_pub(
            nats_cli, broker, "summarize", body, "X-Lane:express", "Nats-Msg-Id:lane-1"
        )
        plain = await nats_pub(nats_cli, broker, "summarize", body, "Nats-Msg-Id:lane-2")
        assert steered.returncode == plain.returncode == 0
        to_express = await watcher.event("completed", message_id="lane-1")
        to_summarizer = await watcher.event("completed", message_id="lane-2")
    assert to_express.agent_id == "cli-express" and to_express.topic == "express"
    assert to_summarizer.agent_id == "cli-worker"


async def test_nats_pub_starts_a_workflow(nats_cli, broker, start_coordinator, watcher):
    """`nats pub reach.task.<workflow>` starts an instance keyed by its Nats-Msg-Id."""
    import msgspec

    from agentreach.coordinator import CoordinatorConfig
    from agentreach.coordinator.workflows.spec import WorkflowSpec

    spec = msgspec.yaml.decode(
        b"chain: [{name: count, intent: summarize}, {name: double, intent: double}]",
        type=WorkflowSpec,
    )
    doubler = Agent("cli-doubler", startup_delay=0)

    @doubler.handler("double")
    async def double(ctx: TaskContext, payload: dict) -> int:
        return payload["words"] * 2

    async with (
        start_coordinator(CoordinatorConfig(workflows={"wordcount": spec})),
        summarizer().running(broker=broker),
        doubler.running(broker=broker),
    ):
        sent = await nats_pub(
            nats_cli, broker, "wordcount", '{"text": "one two three"}', "Nats-Msg-Id:wf-from-cli"
        )
        assert sent.returncode == 0, sent.stderr
        done = await watcher.event("workflow_completed", message_id="wf-from-cli")
        record = await read_record(broker, "wf-from-cli")
    assert done.topic == "wordcount"
    assert record is not None and record.result == 6


async def test_nats_req_on_reach_call_returns_the_result(nats_cli, broker, coordinator, watcher):
    """`nats req reach.call.<topic> '<json>'` prints the task's result, not a storage
    receipt; a task that fails answers with its error; with no coordinator, no responders."""
    async with summarizer().running(broker=broker):
        asked = await run(
            nats_cli,
            "--server",
            broker.url,
            "req",
            broker.names.call("summarize"),
            '{"text": "four words right here"}',
            "-H",
            "Reach-Trace-Id:called",
            "--timeout",
            "10s",
        )
        assert asked.returncode == 0, asked.stderr
        assert '{"words":4}' in asked.stdout
        completed = await watcher.event("completed", topic="summarize")
        assert completed.trace_id == "called"
        failed = await run(
            nats_cli,
            "--server",
            broker.url,
            "req",
            broker.names.call("nobody_serves_this"),
            "{}",
            "--timeout",
            "10s",
        )
    assert failed.returncode == 0, failed.stderr
    assert '"type":"no_route"' in failed.stdout
