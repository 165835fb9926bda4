"""What every ``reach`` command shares: the common options, the command registry, and
turning arguments into names, JSON and URLs."""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentreach import envelopes
from agentreach.broker import DEFAULT_URL, Names
from agentreach.errors import ReachError

Command = Callable[[argparse.Namespace], Awaitable[int]]


class UsageError(ReachError):
    """A mistake in the command line."""


class Commands:
    """Adds subcommands that all take the common options, each with an example."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._sub = parser.add_subparsers(required=True, metavar="COMMAND")
        self._common = _common_options()
        self.parsers: dict[str, argparse.ArgumentParser] = {}

    def add(
        self, name: str, run: Command, help: str, *, example: str | tuple[str, ...] = ()
    ) -> argparse.ArgumentParser:
        """A command; ``example`` is shown under its --help (tests insist every command has
        one)."""
        examples = (example,) if isinstance(example, str) else example
        epilog = None
        if examples:
            epilog = "example" + ("s" if len(examples) > 1 else "") + ":\n"
            epilog += "\n".join(f"  {line}" for line in examples)
        parser = self._sub.add_parser(
            name,
            parents=[self._common],
            help=help,
            description=help,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(command=run)
        self.parsers[name] = parser
        return parser


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL"),
        help=f"NATS server (default $NATS_URL, then {DEFAULT_URL})",
    )
    common.add_argument(
        "--prefix", default=None, help="subject, stream and bucket prefix (default reach)"
    )
    common.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines shown, on stderr (default info)",
    )
    common.add_argument(
        "--log-format",
        default="auto",
        choices=["auto", "console", "json"],
        help="log lines for people (console) or machines (json); auto: console on a terminal",
    )
    return common


def embedded_server_options(
    parser: argparse.ArgumentParser, port: int, *, store: Path = Path(".reach/nats")
) -> None:
    """``--port`` and ``--data-dir`` of the embedded nats-server."""
    parser.add_argument(
        "--port",
        type=int,
        default=port,
        help=f"embedded server port (default {port}; -1 = any free port)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=store,
        help=f"embedded server store (default ./{store})",
    )


def names_of(args: argparse.Namespace) -> Names:
    return Names(prefix=args.prefix or "reach")


def json_argument(text: str) -> Any:
    try:
        return envelopes.decode_json(text)
    except envelopes.DecodeError as exc:
        raise UsageError(f"JSON argument is not valid JSON: {exc}") from None
