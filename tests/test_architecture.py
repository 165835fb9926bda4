"""The shape of the code: layers that import only downward, NATS only behind the broker, small
modules, one import root of our own that installs nothing else at the top level."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import agentreach

REPO = Path(__file__).parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Where each package of agentreach lives in the repository (the setuptools mapping).
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
MAX_LINES = 400
# Lower layers never import higher ones; peers (agents, coordinator) not each other.
LAYERS: dict[str, float] = {
    "agentreach.errors": 0,
    "agentreach.logs": 0,  # the SDK's loggers, quiet until the application configures structlog
    "agentreach.envelopes": 1,
    "agentreach.broker": 2,
    "agentreach.agents": 3,
    "agentreach.coordinator": 3,
    "agentreach.auth": 3,
    "agentreach.cli": 4,
    "agentreach.conformance": 3.75,  # drives an agent from outside; `reach conformance` runs it
    "agentreach.examples": 3.5,  # like any program written with the SDK
    "agentreach.dashboard": 3.7,  # reads the coordinator's views, replays with the SDK
}
FOREIGN_NAMES = ("agents", "broker", "coordinator", "envelopes", "examples", "reach")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def layer(self) -> str | None:
        return _layer_of(self.name)

    def imports(self) -> list[tuple[str, int]]:
        """Every imported module name (for ``from x import y``: x.y and x) with its line."""
        found: list[tuple[str, int]] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                found += [(alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((node.module, node.lineno))
                found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
        return found


def _layer_of(module: str) -> str | None:
    for layer in sorted(LAYERS, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def _modules() -> list[Module]:
    found = []
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            if package == "agentreach" and parts and f"agentreach.{parts[0]}" in PACKAGE_DIRS:
                continue  # mapped elsewhere: counted under its own package
            name = ".".join([package, *parts])
            found.append(Module(name, path, ast.parse(path.read_text(), str(path))))
    return found


MODULES = _modules()


def test_every_package_folder_is_installed() -> None:
    """Each folder with an __init__.py inside our packages is in pyproject's package list."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    folders = {m.name for m in MODULES if m.path.name == "__init__.py"}
    assert folders <= listed, f"add to [tool.setuptools] packages: {sorted(folders - listed)}"


def test_layers_import_only_downwards() -> None:
    """envelopes ← broker ← agents / coordinator ← cli: no import goes up or sideways."""
    wrong = []
    for module in MODULES:
        if module.name == "agentreach" or module.layer is None:
            continue  # the root re-exports the public API from above
        for imported, line in module.imports():
            target = _layer_of(imported)
            if target is None or target == module.layer:
                continue
            if LAYERS[target] >= LAYERS[module.layer]:
                wrong.append(f"{module.path.relative_to(REPO)}:{line} imports {imported}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_nothing_imports_the_root_facade_from_inside() -> None:
    """Inside the package, names come from their own module, never from ``agentreach``'s
    re-exports (which import the whole SDK and would make cycles)."""
    submodules = {name.removeprefix("agentreach.") for name in LAYERS} | {"envelopes"}
    wrong = []
    for module in MODULES:
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom) and node.module == "agentreach":
                names = {alias.name for alias in node.names} - submodules
                if names:
                    wrong.append(f"{module.path.relative_to(REPO)}:{node.lineno} {sorted(names)}")
    assert not wrong, "\n".join(wrong)


def test_nats_is_imported_only_in_the_broker() -> None:
    """nats-py stays behind agentreach.broker; its client objects are not reached through it."""
    wrong = []
    for module in MODULES:
        if module.layer == "agentreach.broker":
            continue
        for imported, line in module.imports():
            if imported == "nats" or imported.startswith("nats."):
                wrong.append(f"{module.path.relative_to(REPO)}:{line} imports {imported}")
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute) and node.attr in ("nc", "js"):
                wrong.append(f"{module.path.relative_to(REPO)}:{node.lineno} uses .{node.attr}")
    assert not wrong, "NATS outside the broker:\n" + "\n".join(wrong)


def test_stored_events_are_read_with_their_headers() -> None:
    """An event is read as stored (``decode_stored_event``, with its headers): anyone may
    have the server store a direct get's answer, of content they chose, on an event subject
    in the coordinator's name; only its headers tell it apart. Read by ``decode_event``, such
    forgeries completed other callers' workflow steps (a security re-test)."""
    wrong = []
    for module in MODULES:
        if module.layer == "agentreach.envelopes":
            continue
        for node in ast.walk(module.tree):
            called = node.func if isinstance(node, ast.Call) else None
            name = getattr(called, "attr", None) or getattr(called, "id", None)
            if name == "decode_event":
                wrong.append(f"{module.path.relative_to(REPO)}:{node.lineno}")
    assert not wrong, "decode_event on a stored event (use decode_stored_event):\n" + "\n".join(
        wrong
    )


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_modules_stay_small(module: Module) -> None:
    """No module passes 400 lines: one concept per module."""
    lines = len(module.path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{module.path.relative_to(REPO)} has {lines} lines"


TYPESCRIPT_SOURCES = sorted((REPO / "sdk/typescript/src").glob("*.ts"))


@pytest.mark.parametrize("path", TYPESCRIPT_SOURCES, ids=lambda p: p.name)
def test_typescript_modules_stay_small(path: Path) -> None:
    """The TypeScript SDK keeps the same limit (its generated types are not written by hand)."""
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines"


def test_public_api_is_reexported_from_the_root() -> None:
    """``from agentreach import Agent, TaskContext, ReachClient, CompensationWorker, …``."""
    for name in ("Agent", "TaskContext", "ReachClient", "CompensationWorker", "PermanentError"):
        assert name in agentreach.__all__ and hasattr(agentreach, name)
    assert sorted(agentreach.__all__) == agentreach.__all__


def test_every_error_is_a_reach_error() -> None:
    """One root: the CLI (and users) catch ReachError for every error of ours."""
    from agentreach.agents import errors as sdk
    from agentreach.broker import errors as broker
    from agentreach.coordinator import ConfigError
    from agentreach.envelopes import errors as envelope
    from agentreach.errors import ReachError

    classes = [ConfigError]
    for errors in (sdk, broker, envelope):
        classes += [c for c in vars(errors).values() if isinstance(c, type)]
    exceptions = [c for c in classes if issubclass(c, BaseException)]
    assert exceptions and all(issubclass(c, ReachError) for c in exceptions)


def _python(code: str, cwd: Path, *extra_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter outside the repository (``-P``: no script dir)."""
    env = {"PYTHONPATH": ":".join(map(str, extra_path))} if extra_path else {}
    return subprocess.run(
        [sys.executable, "-P", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_no_top_level_name_of_other_packages_is_installed(tmp_path: Path) -> None:
    """After install, none of agents, broker, coordinator, envelopes, examples, reach exists."""
    code = (
        "import importlib.util, sys\n"
        f"taken = [n for n in {FOREIGN_NAMES!r} if importlib.util.find_spec(n)]\n"
        "import agentreach.cli\n"
        "print(taken)"
    )
    run = _python(code, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_agentreach_lives_beside_a_top_level_agents_package(tmp_path: Path) -> None:
    """openai-agents installs a top-level ``agents`` (``from agents import Agent``); both work."""
    theirs = tmp_path / "site" / "agents"
    theirs.mkdir(parents=True)
    (theirs / "__init__.py").write_text("class Agent:\n    vendor = 'openai'\n")
    code = (
        "from agents import Agent as TheirAgent\n"
        "from agentreach import Agent\n"
        "Agent('a-1', startup_delay=0)\n"
        "print(TheirAgent.vendor, Agent.__module__)"
    )
    run = _python(code, tmp_path, tmp_path / "site")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["openai", "agentreach.agents.agent"]
