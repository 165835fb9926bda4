"""The options ``reach up`` and ``reach coordinator`` share: the config file, the metrics
port, and workflows built in Python."""

from __future__ import annotations

import argparse

import msgspec

from agentreach.cli.options import UsageError, load_target
from agentreach.coordinator import CoordinatorConfig, WorkflowSpec
from agentreach.envelopes import is_token

DEFAULT_METRICS_PORT = 9464  # what deploy/prometheus/prometheus.yml scrapes


def coordinator_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="coordinator YAML config")
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        default=None,
        help="serve /metrics, /healthz and /readyz on PORT (default: the config's metrics.port,"
        f" else {DEFAULT_METRICS_PORT}; 0 = any free port; -1 = none)",
    )
    parser.add_argument(
        "--metrics-host",
        metavar="HOST",
        default=None,
        help="address to serve metrics on (default: the config's, else 127.0.0.1)",
    )
    parser.add_argument(
        "--workflows",
        metavar="MODULE:OBJECT",
        action="append",
        default=[],
        help="workflows built in Python: a dict of name → workflow (agentreach.coordinator."
        "workflow); repeatable, added to the config's",
    )


def with_cli_options(config: CoordinatorConfig, args: argparse.Namespace) -> CoordinatorConfig:
    """``config`` with the command line's metrics port and Python workflows applied."""
    port = args.metrics_port
    host = args.metrics_host or config.metrics.host
    # Only the default port is a preference: a second replica on this host binds another
    # one instead, and says so.
    implicit = port is None and config.metrics.port is None
    if implicit:
        port = DEFAULT_METRICS_PORT
    elif port is None:
        port = config.metrics.port
    assert port is not None
    if port < -1 or port > 65535:
        raise UsageError(f"--metrics-port takes 0-65535, or -1 for none; got {port}")
    metrics = msgspec.structs.replace(
        config.metrics,
        port=None if port == -1 else port,
        host=host,
        any_port_if_taken=implicit or config.metrics.any_port_if_taken,
    )
    workflows = dict(config.workflows)
    for target in args.workflows:
        for name, spec in load_workflows(target).items():
            if not is_token(name):
                raise UsageError(f"workflow name {name!r} of {target}: use letters, digits, _ -")
            if name in workflows:
                raise UsageError(f"workflow {name!r} of {target} is defined in the config too")
            workflows[name] = spec
    return msgspec.structs.replace(config, metrics=metrics, workflows=workflows)


def load_workflows(target: str) -> dict[str, WorkflowSpec]:
    """The workflows named ``MODULE:OBJECT``: a dict of name → WorkflowSpec."""
    found = load_target(
        target, malformed="--workflows expects MODULE:OBJECT (e.g. myflows:WORKFLOWS)"
    )
    if found is None:
        module, _, name = target.partition(":")
        raise UsageError(f"module {module!r} has no {name!r} (expected a dict of name → workflow)")
    if not isinstance(found, dict):
        raise UsageError(
            f"{target} is {type(found).__name__}; expected a dict of name → workflow, e.g."
            " {'article': workflow.chain(workflow.step('plan', 'plan'), ...)}"
        )
    for name, spec in found.items():
        if not isinstance(name, str):
            raise UsageError(f"{target} has the key {name!r}; a workflow's name is a string")
        if not isinstance(spec, WorkflowSpec):
            raise UsageError(
                f"workflow {name!r} of {target} is {type(spec).__name__}, not a workflow"
                " (build it with agentreach.coordinator.workflow: chain, fanout, steps, machine)"
            )
    return found
