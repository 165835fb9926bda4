"""What every ``reach`` command shares: the common options, the command registry, and
turning arguments into names, JSON and URLs."""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentreach import envelopes
from agentreach.broker import DEFAULT_URL, Auth, Broker, Names
from agentreach.errors import ReachError

Command = Callable[[argparse.Namespace], Awaitable[int]]


class UsageError(ReachError):
    """A mistake in the command line."""


class Commands:
    """Adds subcommands that all take the common options."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._sub = parser.add_subparsers(required=True, metavar="COMMAND")
        self._common = _common_options()

    def add(self, name: str, run: Command, help: str) -> argparse.ArgumentParser:
        parser = self._sub.add_parser(name, parents=[self._common], help=help, description=help)
        parser.set_defaults(command=run)
        return parser


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL"),
        help=f"NATS server (default $NATS_URL, then {DEFAULT_URL})",
    )
    common.add_argument("--prefix", default=None, help="subject prefix (default reach)")
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
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    common.add_argument("--log-format", default="auto", choices=["auto", "console", "json"])
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


def names_of(args: argparse.Namespace) -> Names:
    return Names(prefix=args.prefix or "reach")


def json_argument(text: str) -> Any:
    try:
        return envelopes.decode_json(text)
    except envelopes.DecodeError as exc:
        raise UsageError(f"JSON argument is not valid JSON: {exc}") from None
