"""A ``summarize`` agent that reports progress while it works.

reach agent agentreach.examples.summarize:agent
nats pub reach.task.summarize '{"text": "NATS is a connective technology. It is fast."}'
"""

from agentreach.agents import Agent, PermanentError, TaskContext

agent = Agent("summarizer-1", tags={"role": "worker"}, startup_delay=0)


@agent.handler("summarize", version="1.0", capacity=4, deadline_ms=5_000)
async def summarize(ctx: TaskContext, payload: dict[str, str]) -> dict[str, object]:
    text = payload.get("text") if isinstance(payload, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise PermanentError("payload needs a non-empty 'text' field")
    await ctx.progress("reading")
    sentences = [s.strip() for s in text.replace("!", ".").split(".") if s.strip()]
    return {
        "summary": sentences[0] + "." if sentences else "",
        "sentences": len(sentences),
        "words": len(text.split()),
    }
