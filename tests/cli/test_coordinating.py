"""The options ``reach up`` and ``reach coordinator`` share, turned into the config."""

from __future__ import annotations

import argparse

import msgspec
import pytest

from agentreach.cli.coordinating import DEFAULT_METRICS_PORT, coordinator_options, with_cli_options
from agentreach.cli.options import UsageError
from agentreach.coordinator import CoordinatorConfig
from agentreach.coordinator.observability import MetricsConfig


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    coordinator_options(parser)
    return parser.parse_args(argv)


def test_only_the_default_metrics_port_may_be_given_up_when_taken():
    implicit = with_cli_options(CoordinatorConfig(), parsed()).metrics
    assert (implicit.port, implicit.any_port_if_taken) == (DEFAULT_METRICS_PORT, True)
    chosen = with_cli_options(CoordinatorConfig(), parsed("--metrics-port", "9500")).metrics
    assert (chosen.port, chosen.any_port_if_taken) == (9500, False)
    configured = CoordinatorConfig(metrics=MetricsConfig(port=9600))
    from_config = with_cli_options(configured, parsed()).metrics
    assert (from_config.port, from_config.any_port_if_taken) == (9600, False)
    none = with_cli_options(CoordinatorConfig(), parsed("--metrics-port", "-1")).metrics
    assert none.port is None


def test_a_metrics_port_out_of_range_is_refused():
    with pytest.raises(UsageError, match="--metrics-port takes 0-65535"):
        with_cli_options(CoordinatorConfig(), parsed("--metrics-port", "70000"))


def test_the_config_can_say_its_port_is_a_preference():
    preferred = msgspec.convert(
        {"metrics": {"port": 9464, "any_port_if_taken": True}}, CoordinatorConfig
    )
    assert with_cli_options(preferred, parsed()).metrics.any_port_if_taken
