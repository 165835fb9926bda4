"""The options ``reach up`` and ``reach coordinator`` share, turned into the config."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from agentreach.cli.coordinating import (
    DEFAULT_METRICS_PORT,
    coordinator_options,
    load_workflows,
    with_cli_options,
)
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


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A folder to write workflow modules in, importable as ``load_target`` imports them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def refusal(module_dir: Path, name: str, source: str) -> str:
    (module_dir / f"{name}.py").write_text(
        "from agentreach.coordinator import workflow as wf\n" + textwrap.dedent(source)
    )
    with pytest.raises(UsageError) as refused:
        load_workflows(f"{name}:WORKFLOWS")
    return str(refused.value)


def test_a_definition_refused_as_the_module_is_imported_names_its_workflow(module_dir):
    """The name a module gives the refused definition (a dict key, `dict(name=…)`, a variable
    a dict holds) is in the error with its line; without one, the line alone."""
    in_a_dict = """
        WORKFLOWS = {
            "article": wf.chain(wf.step("plan", "plan")),
            "review": wf.chain(),
        }
    """
    assert refusal(module_dir, "wf_refused_in_a_dict", in_a_dict) == (
        "'wf_refused_in_a_dict', workflow 'review' (line 5):"
        " a workflow needs at least one step: 'chain' is empty"
    )
    in_a_helper = """
        def split():
            flow = wf.fanout([wf.step("a", "a")])
            return flow
        WORKFLOWS = dict(good=wf.chain(wf.step("plan", "plan")), split=split())
    """
    assert refusal(module_dir, "wf_refused_in_a_helper", in_a_helper) == (
        "'wf_refused_in_a_helper', workflow 'split' (line 6): a fan-out needs at least two branches"
    )
    by_variable = """
        review_flow = wf.steps(wf.step("a", "a", after=["zz"]))
        WORKFLOWS = {"review": review_flow}
    """
    assert refusal(module_dir, "wf_refused_by_variable", by_variable) == (
        "'wf_refused_by_variable', workflow 'review' (line 3): step 'a' is after unknown step 'zz'"
    )
    in_a_loop = """
        WORKFLOWS = {}
        for name in ("x", "y"):
            WORKFLOWS[name] = wf.chain()
    """
    assert refusal(module_dir, "wf_refused_in_a_loop", in_a_loop) == (
        "'wf_refused_in_a_loop', line 5: a workflow needs at least one step: 'chain' is empty"
    )


def test_an_entry_that_is_not_a_workflow_is_named(module_dir):
    """A dict entry that is not a workflow is named, not the whole dict called wrong."""
    not_one = """
        WORKFLOWS = {"article": wf.chain(wf.step("plan", "plan")), "review": "plan, write"}
    """
    assert refusal(module_dir, "wf_entry_not_one", not_one).startswith(
        "workflow 'review' of wf_entry_not_one:WORKFLOWS is str, not a workflow"
    )


def test_a_module_without_the_object_named_says_so(module_dir):
    """`--workflows mod:NOPE` names what is missing, not "NoneType"."""
    said = refusal(module_dir, "wf_without_it", "OTHER = {}\n")
    assert said == "module 'wf_without_it' has no 'WORKFLOWS' (expected a dict of name → workflow)"
