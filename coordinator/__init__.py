"""The coordinator service, in wings with one concern each:

- :mod:`.routing`: rules, the fleet of agents and the choice among them, the router, reloads;
- :mod:`.protection`: circuit breakers, queue depths and watermarks, rate limits;
- :mod:`.delivery`: outcomes, retries, max-delivery advisories, dead letters;
- :mod:`.liveness`: heartbeats judged, probes, adaptive cadence, reassignment, registration,
  and tasks left past their ttl in agents' queues;
- :mod:`.workflows`: definitions, the pure run logic, the engine and its control.

At the top: :mod:`.service` (the :class:`Coordinator`), :mod:`.intake`, :mod:`.config`,
:mod:`.lease`, and :mod:`.conditions` (the matcher rules and workflows share).
Workflows are defined in the config's ``workflows:`` section or built in Python with
``agentreach.coordinator.workflow`` (``chain``, ``fanout``, ``steps``, ``machine``).
"""

from agentreach.coordinator import workflow
from agentreach.coordinator.config import (
    ConfigError,
    CoordinatorConfig,
    DeliveryConfig,
    IntakeConfig,
    load_config,
)
from agentreach.coordinator.delivery.unreported import UnreportedConfig
from agentreach.coordinator.liveness.config import LivenessConfig
from agentreach.coordinator.liveness.queue_expiry import QueueExpiryConfig
from agentreach.coordinator.protection.circuit import BreakerConfig
from agentreach.coordinator.protection.queues import QueueConfig
from agentreach.coordinator.protection.rate_limits import RateLimits
from agentreach.coordinator.routing.directory import AgentDirectory
from agentreach.coordinator.routing.rules import RoutingConfig
from agentreach.coordinator.service import Coordinator
from agentreach.coordinator.workflows.spec import WorkflowSpec

__all__ = [
    "AgentDirectory",
    "BreakerConfig",
    "ConfigError",
    "Coordinator",
    "CoordinatorConfig",
    "DeliveryConfig",
    "IntakeConfig",
    "LivenessConfig",
    "QueueConfig",
    "QueueExpiryConfig",
    "RateLimits",
    "RoutingConfig",
    "UnreportedConfig",
    "WorkflowSpec",
    "load_config",
    "workflow",
]
