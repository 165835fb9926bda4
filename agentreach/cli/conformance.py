"""``reach conformance AGENT_ID [-- COMMAND …]``: judge an agent against the protocol."""

from __future__ import annotations

import argparse
import sys

from agentreach.cli.options import Commands, UsageError, broker_of
from agentreach.conformance import CLAUSES, run_conformance


def register(commands: Commands) -> None:
    conformance = commands.add(
        "conformance",
        cmd_conformance,
        "drive a running agent (any language) through agent protocol v1, clause by clause;"
        " with its COMMAND after --, the kit also starts, crashes, restarts and stops it",
        example=(
            "reach conformance conformance-py -- reach agent agentreach.examples.conformance:agent",
            "reach conformance my-agent --only 5,task.progress",
        ),
    )
    conformance.add_argument(
        "agent_id", metavar="AGENT_ID", help="the id of the agent to judge (its card's agent_id)"
    )
    conformance.add_argument(
        "--topic", default="conformance", help="the agent's conformance topic (default conformance)"
    )
    conformance.add_argument(
        "--only",
        default="",
        help="comma-separated clause numbers or names to run (default: all); "
        + ", ".join(c.name for c in CLAUSES),
    )
    conformance.set_defaults(takes_command=True)  # the agent's command line, after --
    usage = conformance.format_usage().removeprefix("usage: ").rstrip()
    conformance.usage = f"{usage} [-- COMMAND ...]"


async def cmd_conformance(args: argparse.Namespace) -> int:
    command = list(args.extra)
    only = {part.strip() for part in args.only.split(",") if part.strip()}
    known = {c.name for c in CLAUSES} | {c.number for c in CLAUSES}
    if unknown := only - known:
        raise UsageError(f"no clause {', '.join(sorted(unknown))}")
    print(
        f"reach conformance {args.agent_id} · agent protocol v1 · topic {args.topic}"
        + (f" · command {' '.join(command)}" if command else ""),
        flush=True,
    )
    async with broker_of(args, name="reach-conformance") as broker:
        report = await run_conformance(
            broker,
            args.agent_id,
            topic=args.topic,
            command=command or None,
            only=only or None,
            out=sys.stdout,
        )
    print(report.summary())
    return 0 if report.ok else 1
