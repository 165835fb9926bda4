"""Workflows built in Python, as the README writes them:

    from agentreach.coordinator import workflow as wf         # or
    from agentreach.coordinator.workflow import chain, step

    WORKFLOWS = {
        "article": wf.chain(wf.step("plan", "plan"), wf.step("write", "write")),
        "research": wf.fanout(
            [wf.step("web", "search_web"), wf.step("papers", "search_papers")],
            join=wf.Join(policy="quorum", quorum=1),
            then=wf.step("merge", "merge"),
        ),
    }

Serve them with ``reach up --workflows mymodule:WORKFLOWS`` (or ``reach coordinator``), or
``Coordinator(broker, CoordinatorConfig(workflows=WORKFLOWS))``. The functions are those of
:mod:`agentreach.coordinator.workflows.builder`; ``help(wf.fanout)`` and the others say
what each takes, and ``docs/python-sdk.md`` has them all, with a caller's deadlines.
"""

from agentreach.coordinator.workflows.builder import chain, fanout, go, machine, state, step, steps
from agentreach.coordinator.workflows.spec import Join, WorkflowSpec

__all__ = ["Join", "WorkflowSpec", "chain", "fanout", "go", "machine", "state", "step", "steps"]
