"""The conformance kit: drives a running agent, in any language, through agent protocol v1
(docs/protocol.md) and judges each clause — ``reach conformance AGENT_ID``."""

from agentreach.conformance.kit import CLAUSES, Clause, run_conformance
from agentreach.conformance.report import NotReady, Report, Status, Verdict

__all__ = ["CLAUSES", "Clause", "NotReady", "Report", "Status", "Verdict", "run_conformance"]
