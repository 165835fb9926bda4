"""The coordinator service: routing, protection, dispatch, dead-lettering and workflows.

Workflows are defined in the config's ``workflows:`` section or built in Python
with ``coordinator.workflow_spec`` (``chain``, ``fanout``, ``steps``, ``machine``).
"""

from agentreach.coordinator import workflow_spec as workflow
from agentreach.coordinator.config import ConfigError, CoordinatorConfig, load_config
from agentreach.coordinator.directory import AgentDirectory
from agentreach.coordinator.service import Coordinator
from agentreach.coordinator.workflow_spec import WorkflowSpec

__all__ = [
    "AgentDirectory",
    "ConfigError",
    "Coordinator",
    "CoordinatorConfig",
    "WorkflowSpec",
    "load_config",
    "workflow",
]
