"""Operators use the real `nats` CLI; what it sends and shows must work with Agent-Reach."""

from __future__ import annotations

import pytest

from agents import Agent, TaskContext
from tests.cli.conftest import run, run_in_terminal

pytestmark = pytest.mark.nats_cli


def summarizer() -> Agent:
    agent = Agent("cli-worker", tags={"role": "worker"}, startup_delay=0)

    @agent.handler("summarize")
    async def summarize(ctx: TaskContext, payload: dict) -> dict:
        return {"words": len(payload["text"].split())}

    return agent


async def test_nats_pub_reaches_an_agent(nats_cli, broker, coordinator, watcher):
    """`nats pub reach.task.<topic> '<json>'` with a trace header is executed by an agent."""
    async with summarizer().running(broker=broker):
        done = await run(
            nats_cli,
            "--server",
            broker.url,
            "pub",
            broker.names.task("summarize"),
            '{"text": "three little words"}',
            "-H",
            "Reach-Trace-Id:from-cli",
        )
        assert done.returncode == 0, done.stderr
        completed = await watcher.event("completed", topic="summarize")
    assert completed.trace_id == "from-cli"
    assert completed.detail["result"] == {"words": 3}


async def test_nats_stream_view_shows_dead_letters(nats_cli, broker, coordinator, watcher):
    """`nats stream view REACH_DLQ` shows an invalid body's dead letter with its reason."""
    sent = await run(
        nats_cli,
        "--server",
        broker.url,
        "pub",
        broker.names.task("summarize"),
        '{"text": ',
        "-H",
        "Nats-Msg-Id:broken-1",
    )
    assert sent.returncode == 0, sent.stderr
    await watcher.dead_letter("invalid_envelope")
    stream = broker.names.dlq_stream
    shown = await run_in_terminal(nats_cli, "--server", broker.url, "stream", "view", stream)
    assert broker.names.dlq("invalid_envelope", "summarize") in shown.stdout
    assert '"message_id":"broken-1"' in shown.stdout
    assert "Input data was truncated" in shown.stdout


async def test_nats_kv_ls_lists_registered_agents(nats_cli, broker):
    """`nats kv ls reach_agents` lists an agent once it is serving."""
    async with summarizer().running(broker=broker):
        bucket = broker.names.agents_bucket
        listed = await run(nats_cli, "--server", broker.url, "kv", "ls", bucket)
    assert listed.returncode == 0, listed.stderr
    assert "cli-worker" in listed.stdout.split()


async def test_nats_micro_ls_lists_live_agents(nats_cli, broker):
    """`nats micro ls` shows each live agent as a reach-agent service instance."""
    async with summarizer().running(broker=broker):
        listed = await run(nats_cli, "--server", broker.url, "micro", "ls")
    assert listed.returncode == 0, listed.stderr
    assert "reach-agent" in listed.stdout
