"""The coordinator service: routing, dispatch and dead-lettering."""

from coordinator.config import ConfigError, CoordinatorConfig, load_config
from coordinator.directory import AgentDirectory
from coordinator.service import Coordinator

__all__ = ["AgentDirectory", "ConfigError", "Coordinator", "CoordinatorConfig", "load_config"]
