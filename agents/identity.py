"""An agent's stable identity: the id given, or one kept in a file across restarts."""

from __future__ import annotations

import uuid
from pathlib import Path

from agentreach.agents.errors import AgentConfigError

DEFAULT_IDENTITY_FILE = Path(".reach/agent-id")


def resolve_agent_id(agent_id: str | None, identity_file: Path) -> str:
    """``agent_id`` if given; else the id kept in ``identity_file``, created on first use."""
    if agent_id:
        return agent_id
    try:
        kept = identity_file.read_text().strip()
    except FileNotFoundError:
        kept = ""
    except OSError as exc:
        raise AgentConfigError(f"cannot read identity file {identity_file}: {exc}") from None
    if kept:
        return kept
    generated = f"agent-{uuid.uuid4().hex[:12]}"
    try:
        identity_file.parent.mkdir(parents=True, exist_ok=True)
        identity_file.write_text(generated + "\n")
    except OSError as exc:
        raise AgentConfigError(f"cannot write identity file {identity_file}: {exc}") from None
    return generated
