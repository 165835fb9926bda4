"""``reach``: the command line of Agent-Reach. Each command group is a module of its own."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import signal
import sys
from collections.abc import Iterator

from agentreach.cli import (
    agents,
    auth,
    completion,
    conformance,
    dashboard,
    dlq,
    manual,
    provision,
    publish,
    routes,
    schema,
    serve,
    trace,
    workflows,
)
from agentreach.cli.exit_codes import (
    FAILED,
    INTERRUPTED,
    OK,
    OUTCOME_UNKNOWN,
    USAGE,
    OutcomeUnknown,
)
from agentreach.cli.logs import configure_logging
from agentreach.cli.options import Commands, OneLineParser, UnparsedArgument
from agentreach.cli.terminal import shown_output
from agentreach.errors import ReachError

# completion last: it reads every other command's options.
GROUPS = (
    serve,
    publish,
    trace,
    provision,
    schema,
    agents,
    workflows,
    routes,
    dlq,
    auth,
    manual,
    dashboard,
    conformance,
    completion,
)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``reach`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    # What follows `--` is a command line of its own (`reach conformance ID -- node agent.js`).
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    root = parser()
    if argv and argv[0].startswith("--") and argv[0].split("=")[0] not in ("--help", "--version"):
        # Each command's options are its own: `reach --nats-url URL agents` took URL as the command.
        root.error(f"options come after the command: reach COMMAND {argv[0]} …")
    args, unknown = root.parse_known_args(argv)
    if unknown:  # said by the command's own parser, which knows its usage
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra and not getattr(args, "takes_command", False):
        root.error(f"unexpected arguments after --: {' '.join(extra)}")
    args.extra = extra
    configure_logging(args.log_level, args.log_format)
    with shown_output():  # after the logging's set-up: log lines are escaped by their renderer
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        with _terminated_as_interrupted(args.serves):
            code = asyncio.run(args.command(args))
        sys.stdout.flush()  # a short output is written here, not by print: into the pipe too
        return code
    except UnparsedArgument as exc:  # said as argparse says its own: the command, its help
        prog = args.command_parser.prog
        print(f"{prog}: error: {exc} (see `{prog} --help`)", file=sys.stderr)
        return USAGE
    except ReachError as exc:
        print(f"reach: error: {exc}", file=sys.stderr)
        return OUTCOME_UNKNOWN if isinstance(exc, OutcomeUnknown) else FAILED
    except KeyboardInterrupt:  # before a service took its signals over: it stopped starting
        return OK if args.serves else INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`reach … | head`): nothing more to say, and no traceback.
        # Python would fail again flushing stdout at exit, so it goes to /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILED


def parser() -> argparse.ArgumentParser:
    root = OneLineParser(
        prog="reach",
        allow_abbrev=False,  # `--ttl 5` is a mistake to name, not `--ttl-ms 5`
        description="Agent-Reach over NATS JetStream: `reach COMMAND --help` shows each one's"
        " options and an example.",
        epilog="example:\n  reach up    # then, in another terminal:"
        " reach agent agentreach.examples.summarize:agent",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=f"reach {_version()}")
    commands = Commands(root)
    for group in GROUPS:
        group.register(commands)
    return root


def _version() -> str:
    try:
        return importlib.metadata.version("agentreach")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


@contextlib.contextmanager
def _terminated_as_interrupted(serves: bool) -> Iterator[None]:
    """For a service: SIGTERM before it takes its signals over (while it waits for NATS)
    stops it as Ctrl-C does, and it exits 0; the signal's default killed it (143, against
    the README's 0 once stopped). A KeyboardInterrupt of its own, not a SIGINT raised: a
    process started with SIGINT ignored (a background job, a test runner's) keeps it so."""
    if not serves:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
