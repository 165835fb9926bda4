"""The agents behind the workflows of ``deploy/coordinator/coordinator.yaml``, so the README's
walkthrough runs as written: ``article`` (plan → write → review → publish, undone by
unpublish), ``research`` (three searches, then merge) and ``order`` (charge, reserve, ship,
or refund).

reach up --config deploy/coordinator/coordinator.yaml
reach agent agentreach.examples.newsroom:agent
nats pub reach.task.article '{"topic": "nats"}' -H Nats-Msg-Id:article-1
reach workflows show article-1
"""

from __future__ import annotations

import re

from agentreach.agents import Agent, PermanentError, TaskContext

agent = Agent("newsroom-1", tags={"role": "writer"}, startup_delay=0)


# -- article ----------------------------------------------------------------------------
@agent.handler("plan", version="1.0", capacity=4)
async def plan(ctx: TaskContext, payload: dict) -> dict:
    topic = str(payload.get("topic") or "").strip()
    if not topic:
        raise PermanentError("payload needs a 'topic'")
    return {"topic": topic, "outline": [f"What {topic} is", f"Why {topic} matters", "How to start"]}


@agent.handler("write", version="1.0", capacity=4)
async def write(ctx: TaskContext, payload: dict) -> dict:
    outline, topic = payload.get("outline") or [], payload.get("topic", "")
    await ctx.progress(f"writing {len(outline)} sections")
    sections = [f"{heading}. A paragraph about it." for heading in outline]
    return {"title": f"All about {topic}", "text": "\n\n".join(sections), "words": 8 * len(outline)}


@agent.handler("review", version="1.0", capacity=4)
async def review(ctx: TaskContext, payload: dict) -> dict:
    approved = bool(payload.get("text"))
    return {**payload, "approved": approved, "notes": [] if approved else ["no text"]}


@agent.handler("publish", version="1.0", capacity=4)
async def publish(ctx: TaskContext, payload: dict) -> dict:
    if not payload.get("approved"):
        raise PermanentError("the review did not approve this draft")
    slug = re.sub(r"[^a-z0-9]+", "-", str(payload.get("title", "")).lower()).strip("-")
    return {"url": f"https://blog.example/{slug}", "title": payload.get("title")}


@agent.handler("unpublish", version="1.0", capacity=4)
async def unpublish(ctx: TaskContext, payload: object) -> dict:
    return {"unpublished": True}


# -- research ---------------------------------------------------------------------------
async def _search(where: str, payload: dict) -> dict:
    query = str(payload.get("query") or payload.get("topic") or "")
    return {"source": where, "hits": [f"{where}: {query} ({i})" for i in (1, 2)]}


@agent.handler("search_web", version="1.0", capacity=4)
async def search_web(ctx: TaskContext, payload: dict) -> dict:
    return await _search("web", payload)


@agent.handler("search_papers", version="1.0", capacity=4)
async def search_papers(ctx: TaskContext, payload: dict) -> dict:
    return await _search("papers", payload)


@agent.handler("search_news", version="1.0", capacity=4)
async def search_news(ctx: TaskContext, payload: dict) -> dict:
    return await _search("news", payload)


@agent.handler("merge", version="1.0", capacity=4)
async def merge(ctx: TaskContext, payload: dict) -> dict:
    results = payload.get("results") or {}
    hits = [hit for found in results.values() for hit in found.get("hits", [])]
    return {
        "hits": hits,
        "sources": sorted(results),
        "missing": sorted(payload.get("missing") or {}),
    }


# -- order ------------------------------------------------------------------------------
@agent.handler("charge", version="1.0", capacity=4)
async def charge(ctx: TaskContext, payload: dict) -> dict:
    return {**payload, "paid": float(payload.get("amount", 0)) > 0}


@agent.handler("reserve_stock", version="1.0", capacity=4)
async def reserve_stock(ctx: TaskContext, payload: dict) -> dict:
    return {**payload, "reserved": True}


@agent.handler("ship", version="1.0", capacity=4)
async def ship(ctx: TaskContext, payload: dict) -> dict:
    return {**payload, "shipped": True}


@agent.handler("refund", version="1.0", capacity=4)
async def refund(ctx: TaskContext, payload: dict) -> dict:
    return {**payload, "refunded": True}
