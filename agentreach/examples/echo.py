"""The smallest agent: answers ``echo`` with its payload and ``shout`` in capitals.

reach agent agentreach.examples.echo:agent
nats pub reach.task.echo '{"text": "hello"}'
"""

from agentreach.agents import Agent, TaskContext

agent = Agent("echo-1", tags={"role": "demo"}, startup_delay=0)  # demo agents start at once


@agent.handler("echo", version="1.0", capacity=16)
async def echo(ctx: TaskContext, payload: object) -> object:
    return payload


@agent.handler("shout", version="1.0", capacity=4)
def shout(ctx: TaskContext, payload: dict[str, str]) -> dict[str, str]:
    # A plain function: the SDK runs it in a worker thread.
    return {"text": str(payload.get("text", "")).upper()}
