"""What every ``reach`` command shares: the common options, the command registry, and
turning arguments into names, JSON and URLs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from agentreach import envelopes
from agentreach.broker import DEFAULT_URL, Auth, Broker, BrokerConfig, Names, parse_replicas
from agentreach.broker.prefix import prefix_problem
from agentreach.cli.definitions import raised_by_a_definition, refused_where
from agentreach.cli.exit_codes import USAGE
from agentreach.errors import ReachError

Command = Callable[[argparse.Namespace], Awaitable[int]]


class UsageError(ReachError):
    """A mistake in the command line."""


class UnparsedArgument(UsageError):
    """The command line could not be parsed, found by the command: exit 2, as argparse's own."""


class MissingArgument(UnparsedArgument):
    """An argument the command needs was not given."""


class OneLineParser(argparse.ArgumentParser):
    """A mistake on the command line is one line that names it and where help is, not
    argparse's usage block above it (10 lines for a command with the common options)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class Commands:
    """Adds subcommands that all take the common options, each with an example."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._sub = parser.add_subparsers(required=True, metavar="COMMAND")
        self._common = _common_options()
        self.parsers: dict[str, argparse.ArgumentParser] = {}

    def add(
        self,
        name: str,
        run: Command,
        help: str,
        *,
        example: str | tuple[str, ...] = (),
        serves: bool = False,
    ) -> argparse.ArgumentParser:
        """A command; ``example`` is shown under its --help (tests insist every command has
        one). One that ``serves`` runs until stopped, and exits 0 when stopped by a signal,
        even before it started serving (waiting for NATS)."""
        examples = (example,) if isinstance(example, str) else example
        epilog = None
        if examples:
            epilog = "example" + ("s" if len(examples) > 1 else "") + ":\n"
            epilog += "\n".join(f"  {line}" for line in examples)
        parser = self._sub.add_parser(
            name,
            allow_abbrev=False,
            parents=[self._common],
            help=help,
            description=help,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(command=run, command_parser=parser, serves=serves)
        self.parsers[name] = parser
        return parser


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL"),
        help=f"NATS server, or several comma-separated (a cluster's seed list);"
        f" default $NATS_URL, then {DEFAULT_URL}",
    )
    secured = common.add_argument_group(
        "authentication (default: the nats CLI's variables NATS_CREDS, NATS_NKEY, …)"
    )
    secured.add_argument("--creds", type=Path, help="a .creds file: user JWT and seed")
    secured.add_argument("--nkey", type=Path, help="a file holding an nkey seed")
    secured.add_argument("--token-file", type=Path, help="a file holding a token")
    secured.add_argument("--user", help="user name (the password from --password-file)")
    secured.add_argument("--password-file", type=Path, help="a file holding the password")
    secured.add_argument("--tls-ca", type=Path, help="CA certificate(s) to trust (PEM)")
    secured.add_argument("--tls-cert", type=Path, help="client certificate (PEM)")
    secured.add_argument("--tls-key", type=Path, help="client key (PEM)")
    secured.add_argument("--tls-first", action="store_true", help="TLS before the NATS handshake")
    common.add_argument(
        "--prefix",
        default=None,
        type=prefix_arg,
        help="subject, stream and bucket prefix (default reach)",
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


def auth_of(args: argparse.Namespace) -> Auth:
    """Credentials from the flags, then the environment (secrets from files, never argv)."""
    flags = Auth(
        creds=args.creds,
        nkey=args.nkey,
        token=_secret(args.token_file, "--token-file"),
        user=args.user,
        password=_secret(args.password_file, "--password-file"),
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_first=args.tls_first,
    )
    return flags.merged(Auth.from_env())


# Parties that may not read the streams and buckets themselves: they ask the coordinator for
# what is theirs (their traces), and are refused the rest.
ASKING_ROLES = ("caller", "agent", "worker")


def operators_only(args: argparse.Namespace, what: str) -> None:
    """Refuse at once the creds of a role that may not read ``what``: its reads would be
    denied by the server, and time out here."""
    auth = auth_of(args)
    if auth.role in ASKING_ROLES:
        raise UsageError(
            f"{what} needs an operator's creds; {auth.identity!r} is"
            f" {'an' if auth.role == 'agent' else 'a'} {auth.role}"
            " (`reach auth operator NAME` issues them)"
        )


def broker_of(args: argparse.Namespace, *, name: str = "reach-cli", wait: bool = False) -> Broker:
    """The connection a command uses: its URL, prefix and credentials."""
    return Broker(args.nats_url, names=names_of(args), name=name, auth=auth_of(args), wait=wait)


def _secret(path: Path | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror}") from None


def replication_options(parser: argparse.ArgumentParser) -> None:
    """``--replicas`` and ``--durable``: they override the config's ``broker`` section."""
    parser.add_argument(
        "--replicas",
        type=_replicas,
        default=None,
        help="replicas of every stream and bucket: auto (3 on a JetStream cluster of 3 or"
        " more servers, else 1), 1, 3 or 5 (default: the config's broker.replicas, auto)",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        default=None,
        help="place the task, dispatch and dead-letter streams on servers tagged"
        " sync:always (the config's broker.durable_tags)",
    )


def _replicas(text: str) -> object:
    try:
        return parse_replicas(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def prefix_arg(text: str) -> str:
    if (problem := prefix_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def broker_config_of(args: argparse.Namespace, config: BrokerConfig) -> BrokerConfig:
    """The config's ``broker`` section with what ``--replicas`` / ``--durable`` override."""
    changes: dict[str, Any] = {}
    if getattr(args, "replicas", None) is not None:
        changes["replicas"] = args.replicas
    if getattr(args, "durable", None):
        changes["durable"] = True
    return msgspec.structs.replace(config, **changes) if changes else config


def names_of(args: argparse.Namespace) -> Names:
    return Names(prefix=args.prefix or "reach")


def load_target(target: str, *, malformed: str) -> object:
    """The object named ``MODULE:OBJECT`` (the current directory is importable), or None
    when the module has no such name; ``malformed`` is what a target without the colon is
    told before ``got …``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UsageError(f"{malformed}, got {target!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"cannot import {module_name!r}: {exc} (run from the folder that holds it, or add"
            " that folder to PYTHONPATH)"
        ) from None
    except SyntaxError as exc:
        raise UsageError(f"{module_name!r} is not valid Python: {exc}") from None
    except ReachError as exc:  # a workflow or an agent declared wrongly, as it was imported
        raise UsageError(f"{module_name!r}: {exc}") from None
    except ValueError as exc:
        if not raised_by_a_definition(exc):
            raise  # the module's own bug: its traceback says where
        where = refused_where(exc)
        raise UsageError(f"{module_name!r}{', ' if where else ''}{where}: {exc}") from None
    return getattr(module, attr, None)


def an_id(text: str) -> str:
    """argparse type of an agent, message, trace or workflow id: each stands as one token of
    NATS subjects and keys, so a wildcard or a dot would reach other ids' records."""
    if not envelopes.is_token(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} cannot be an id: ids are 1-128 letters, digits, '_' or '-'"
        )
    return text


def non_negative_seconds(text: str) -> float:
    """argparse type of a delay in seconds: 0 or more (a finite number)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 or more seconds")
    return seconds


def a_topic(text: str) -> str:
    """argparse type of a topic: one token of the task's subject (`a.b` would be sent on
    topic `a`, and dead-lettered)."""
    if not envelopes.is_token(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} cannot be a topic: topics are 1-128 letters, digits, '_' or '-'"
        )
    return text


def json_text(argument: str) -> str:
    """The JSON an argument gives: itself; ``@FILE``, the file's; ``-``, stdin's (a shell
    caps one argument at 128 KiB, payloads travel up to the server's limit and beyond)."""
    if argument == "-":
        return sys.stdin.read()
    if argument.startswith("@"):
        path = Path(argument[1:])
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the JSON file {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"the JSON file {path} is not UTF-8 text") from None
    return argument


def json_argument(text: str, name: str = "JSON") -> Any:
    """``text`` decoded; a UsageError naming the argument (``name``) when it is no JSON."""
    try:
        return envelopes.decode_json(text)
    except envelopes.DecodeError as exc:
        raise UsageError(f"{name} argument is not valid JSON: {exc}") from None
