"""``reach demo``: the whole path on one machine, then a clean exit.

Starts the coordinator and the example agents, sends a few tasks the ways
operators and programs do, and prints each result and its trace.
"""

from __future__ import annotations

import contextlib
import json

from agentreach.agents import ReachClient, TaskFailed
from agentreach.broker import Names
from agentreach.cli import trace as tracing
from agentreach.cli import workflow_views
from agentreach.cli.serve import provisioned
from agentreach.coordinator import Coordinator, CoordinatorConfig
from agentreach.coordinator import workflow as wf
from agentreach.coordinator.workflows import read_record
from agentreach.envelopes import headers as h
from agentreach.envelopes import new_id
from agentreach.examples.echo import agent as echo_agent
from agentreach.examples.summarize import agent as summarize_agent

# A two-step workflow over the example agents: the summary's first sentence, shouted.
HEADLINE = wf.chain(
    wf.step("summary", "summarize"),
    wf.step("headline", "shout", input={"text": "$.summary.summary"}),
)
TEXT = "NATS moves messages between agents. JetStream keeps them. Agent-Reach makes them arrive."


async def run_demo(url: str, names: Names) -> int:
    """Run the demo against ``url``; returns the exit code.

    Trace ids end with this run's own suffix: the demo's store outlives a run, and a
    trace must not gather the events of earlier runs.
    """
    run_id = new_id()[-6:]
    async with contextlib.AsyncExitStack() as stack:
        broker = await stack.enter_async_context(provisioned(url, names, name="coordinator"))
        config = CoordinatorConfig(workflows={"headline": HEADLINE})
        await stack.enter_async_context(Coordinator(broker, config).running())
        for agent in (echo_agent, summarize_agent):
            await stack.enter_async_context(agent.running(url, names=names))
        client = await stack.enter_async_context(ReachClient(url, names=names, name="demo"))
        print(f"Agent-Reach demo on {url}\n")
        trace_ids = [
            await _invoke(client, "summarize", {"text": TEXT}, run_id),
            await _invoke(client, "shout", {"text": "reach every agent"}, run_id),
            await _invoke(client, "translate", {"text": "no agent serves this topic"}, run_id),
        ]
        trace_ids.append(await _like_nats_pub(client, run_id))
        trace_ids.append(await _invoke(client, "headline", {"text": TEXT}, run_id))
        for trace_id in trace_ids:
            steps = await tracing.collect(broker, trace_id)
            for started in (s.event for s in steps if s.event.event == "workflow_started"):
                if record := await read_record(broker, started.message_id):
                    print(workflow_views.tree(record))
            print(tracing.render(trace_id, steps), end="\n\n")
    return 0


async def _invoke(client: ReachClient, topic: str, payload: object, run_id: str) -> str:
    trace_id = f"demo-{topic}-{run_id}"
    print(f"→ invoke {topic} {json.dumps(payload)}")
    try:
        result = await client.invoke(topic, payload, trace_id=trace_id, execute_deadline_ms=5_000)
        print(f"  result: {json.dumps(result, ensure_ascii=False)}\n")
    except TaskFailed as exc:
        print(f"  {type(exc).__name__}: {exc}\n")
    return trace_id


async def _like_nats_pub(client: ReachClient, run_id: str) -> str:
    """A bare JSON body with headers on core NATS, as `nats pub -H …` sends it."""
    broker = client.broker
    inbox = broker.new_inbox()
    body = b'{"text": "sent like nats pub"}'
    print(f"→ nats pub {broker.names.task('echo')} '{body.decode()}'")
    async with await broker.subscribe(inbox) as replies:
        await broker.publish_core(
            broker.names.task("echo"),
            body,
            headers={h.TRACE_ID: f"demo-nats-pub-{run_id}", h.REPLY_TO: inbox},
        )
        while True:
            reply = (await replies.next(timeout_s=10)).data
            if b'"kind":"result"' in reply:
                print(f"  reply: {reply.decode()}\n")
                break
    return f"demo-nats-pub-{run_id}"
