"""`reach routes check FILE` on workflow definitions the coordinator would refuse: one clear
line naming the mistake, a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from tests.cli.conftest import reach_command, run


@pytest.mark.parametrize(
    ("workflows", "said"),
    [
        (
            "w1: {chain: []}",
            "workflow 'w1': a workflow needs at least one step: 'chain' is empty"
            " - at `$.workflows.w1`",
        ),
        (
            "w2: {chain: [{name: b, intent: fast_b}, {name: again, intent: w2}]}",
            "cycle: w2 → w2 (`$.workflows.w2` step 'again' runs 'w2')",
        ),
        (
            "a: {chain: [{name: s, intent: b}]}, b: {chain: [{name: t, intent: a}]}",
            "cycle: a → b → a",
        ),
        (
            "w3: {steps: [{name: a, after: [b]}, {name: b, after: [a]}]}",
            "steps wait for each other: cycle: a → b → a",
        ),
    ],
)
async def test_a_workflow_the_coordinator_refuses_is_one_line(
    tmp_path, workflows: str, said: str
) -> None:
    """An empty chain, a workflow that runs itself (directly or through another) and steps
    that wait for each other are each refused in one line."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(f"workflows: {{{workflows}}}\n")
    checked = await run(reach_command(), "routes", "check", str(path))
    assert checked.returncode == 1
    assert checked.stderr.count("\n") == 1 and "Traceback" not in checked.stderr
    assert checked.stderr.startswith(f"reach: error: {path}: ")
    assert said in checked.stderr


async def test_nested_workflows_without_a_loop_pass(tmp_path) -> None:
    """A workflow running another (no loop) is listed like any other."""
    path = tmp_path / "coordinator.yaml"
    path.write_text(
        "workflows:\n"
        "  inner: {chain: [{name: a, intent: work}]}\n"
        "  outer: {chain: [{name: b, intent: inner}, {name: c, intent: work}]}\n"
    )
    checked = await run(reach_command(), "routes", "check", str(path))
    assert checked.returncode == 0, checked.stderr
    assert "workflow outer           chain, 2 steps" in checked.stdout


async def test_a_file_that_is_not_yaml_is_one_line_naming_where(tmp_path) -> None:
    """The YAML parser's four lines (naming `"<byte string>"`) are one, with the places."""
    path = tmp_path / "coordinator.yaml"
    path.write_text("routes:\n  - match: {topic: x\n")
    checked = await run(reach_command(), "routes", "check", str(path))
    assert checked.returncode == 1
    assert checked.stderr.count("\n") == 1 and "<byte string>" not in checked.stderr
    assert "while parsing a flow mapping (line 2, column 12)" in checked.stderr
