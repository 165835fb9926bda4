"""An agent that fails every task it gets: for trying retries, breakers, isolation, the
dead-letter stream and the alerts (``ReachAgentsIsolated`` fires after 5 messages failed in a row).

reach agent agentreach.examples.failing:agent
reach publish unreliable '{"n": 1}'       # tried 3 times, then dead-lettered

Sent one at a time, each is tried 3 times; once 5 attempts in a row failed the agent is
isolated, and the next ones are refused at once (``circuit_open``, no retry). Sent together
(``--count 6``), their first attempts alone make the 5: none is retried.
"""

from agentreach.agents import Agent, TaskContext

agent = Agent("failing-1", tags={"role": "demo"}, startup_delay=0)


@agent.handler("unreliable", version="1.0", capacity=4)
async def unreliable(ctx: TaskContext, payload: object) -> object:
    raise RuntimeError(f"unreliable always fails (attempt {ctx.attempt})")
