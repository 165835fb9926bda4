"""The coordinator service: routing, protection, dispatch, dead-lettering and workflows.

Workflows are defined in the config's ``workflows:`` section or built in Python
with ``coordinator.workflow_spec`` (``chain``, ``fanout``, ``steps``, ``machine``).
"""

from coordinator import workflow_spec as workflow
from coordinator.config import ConfigError, CoordinatorConfig, load_config
from coordinator.directory import AgentDirectory
from coordinator.service import Coordinator
from coordinator.workflow_spec import WorkflowSpec

__all__ = [
    "AgentDirectory",
    "ConfigError",
    "Coordinator",
    "CoordinatorConfig",
    "WorkflowSpec",
    "load_config",
    "workflow",
]
