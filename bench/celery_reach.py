"""The Agent-Reach side of ``bench/celery_compare.py`` when it runs as deployed: the no-op
agent (``reach agent celery_reach:agent``) and the 3-step chain (``reach coordinator
--workflows celery_reach:workflows``), each in a process of its own, as Celery's worker is.
"""

from __future__ import annotations

from agentreach.agents import Agent, TaskContext
from agentreach.coordinator import workflow as wf

CONCURRENCY = 2  # Celery's threads, the agent's capacity

workflows = {"flow": wf.chain(wf.step("a", "noop"), wf.step("b", "noop"), wf.step("c", "noop"))}
agent = Agent("benchcel-noop", startup_delay=0)


@agent.handler("noop", capacity=CONCURRENCY)
async def noop(ctx: TaskContext, payload: object) -> object:
    return payload
