"""``reach dashboard`` (a live web page) and ``reach top`` (the same in a terminal)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import secrets
from pathlib import Path
from urllib.parse import quote

import structlog

from agentreach.cli.options import Commands, UsageError, broker_of, operators_only
from agentreach.cli.redraw import redraw_until_interrupted
from agentreach.cli.serve import until_signal
from agentreach.coordinator.observability import HttpServer
from agentreach.dashboard import AllowedHosts, Board, DashboardApp, History, render, valid_token

log = structlog.get_logger("reach")
WILDCARDS = ("", "0.0.0.0", "::")  # every address: each request's own is answered
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "REACH_DASHBOARD_TOKEN"
HISTORY_WAIT_S = 30.0  # at most, for `reach top --once` to read the window's events


def register(commands: Commands) -> None:
    dashboard = commands.add(
        "dashboard",
        cmd_dashboard,
        "serve the live dashboard: the five metrics, agents, dead letters, workflows, traces",
        example=(
            "reach dashboard                # then open the URL it prints:"
            " http://127.0.0.1:8765/?token=…",
            "reach dashboard --access-token-file ~/.reach/dashboard-token  # one token, kept",
        ),
        serves=True,
    )
    dashboard.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this host)"
    )
    dashboard.add_argument(
        "--port", type=int, default=8765, help="port to listen on (default 8765; 0 = any free one)"
    )
    dashboard.add_argument(
        "--read-only", action="store_true", help="no replay buttons; replays are refused"
    )
    dashboard.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer besides localhost, 127.0.0.1, [::1] and the address served"
        " on (NAME: any port, NAME:PORT: that one); repeatable. Any other Host is refused"
        " (421): a page of another site could reach the dashboard under its own name",
    )
    access = dashboard.add_mutually_exclusive_group()
    access.add_argument(
        "--access-token-file",
        type=Path,
        metavar="PATH",
        help="read the dashboard's access token from PATH (keep it readable by you only:"
        " chmod 600); a PATH that does not exist is created (mode 600) with a new token. Default:"
        " the token"
        f" in ${TOKEN_ENV}, else a new one at each start, printed in the URL to open. Every"
        " request but /healthz and /readyz needs the token (401): the page's ?token= (a"
        " cookie then) or the header Authorization: Bearer TOKEN",
    )
    access.add_argument(
        "--no-token",
        action="store_true",
        help="ask no access token (a single-user host, or a proxy in front that does its own"
        " login): any local user or process can then read everything and replay, with your creds",
    )
    top = commands.add(
        "top",
        cmd_top,
        "the five metrics, agents and dead letters in the terminal, redrawn",
        example=("reach top", "reach top --once"),
    )
    top.add_argument(
        "--interval", type=float, default=2.0, help="seconds between redraws (default 2)"
    )
    top.add_argument("--once", action="store_true", help="print once and exit")
    for parser in (dashboard, top):
        parser.add_argument(
            "--window-min",
            type=float,
            default=30.0,
            help="minutes of history in the charts (default 30); read from REACH_EVENTS at start",
        )
        parser.add_argument(
            "--step-s",
            type=float,
            default=10.0,
            help="seconds between points of the charts (default 10)",
        )
        parser.add_argument(
            "--period-min",
            type=float,
            default=10.0,
            help="the P99 latency is of this many minutes, against as many before (default 10)",
        )


def _history(args: argparse.Namespace) -> History:
    if args.step_s <= 0 or args.window_min <= 0 or args.period_min <= 0:
        raise UsageError("--step-s, --window-min and --period-min take positive numbers")
    return History(step_s=args.step_s, window_s=args.window_min * 60, period_s=args.period_min * 60)


async def cmd_dashboard(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:  # said before connecting, not as bind()'s OverflowError
        raise UsageError(f"--port takes 0-65535 (0: any free one); got {args.port}")
    operators_only(args, "the state the dashboard shows")
    history = _history(args)
    listening = [] if args.host in WILDCARDS else [args.host]  # a name to listen on, too
    try:
        hosts = AllowedHosts([*listening, *args.allow_host])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    token, given_in = _token(args)
    async with (
        broker_of(args, name="reach-dashboard") as broker,
        Board(broker, history, read_only=args.read_only, version=_version()) as board,
        HttpServer(
            DashboardApp(board, token=token, hosts=hosts),  # type: ignore[arg-type]
            host=args.host,
            port=args.port,
        ) as server,
    ):
        _warn(args.host, token)
        if token is None:
            print(f"dashboard on {server.url}", flush=True)
        elif given_in is None:  # made now: the URL is the only way to learn it
            print(f"dashboard on {server.url}?token={quote(token, safe='')}", flush=True)
        else:  # kept out of the output, which may end up in a log
            print(f"dashboard on {server.url}?token=<the token in {given_in}>", flush=True)
        await until_signal(f"dashboard on {server.url}")
    return 0


def _token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The access token (None: ``--no-token``) and where it was given (None: made now)."""
    if args.no_token:
        return None, None
    if args.access_token_file is not None:
        return _token_file(args.access_token_file)
    if given := os.environ.get(TOKEN_ENV, "").strip():
        try:
            return valid_token(given, f"${TOKEN_ENV}"), f"${TOKEN_ENV}"
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return secrets.token_urlsafe(32), None


def _token_file(path: Path) -> tuple[str, str | None]:
    where = f"--access-token-file {path}"
    try:  # O_EXCL: never overwrite, and never write into a file someone else made readable
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror}") from None
    else:
        token = secrets.token_urlsafe(32)
        with os.fdopen(fd, "w") as file:
            file.write(token + "\n")
        return token, None
    try:
        text, mode = path.read_text(), path.stat().st_mode
        token = valid_token(text, where)
    except OSError as exc:
        raise UsageError(f"{where}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if mode & 0o077:
        log.warning(
            f"others than its owner may read the token file: chmod 600 {path}",
            mode=oct(mode & 0o777),
        )
    return token, where


def _warn(host: str, token: str | None) -> None:
    if token is None:
        log.warning(
            "no access token (--no-token): anyone who reaches the dashboard, any local user or"
            " process included, can read every dead letter and replay tasks with your creds",
            host=host,
        )
    elif host not in LOOPBACK:
        log.warning(
            "the dashboard speaks plain HTTP: its token and all it shows cross the network"
            " unencrypted; put a TLS proxy in front (--allow-host its name)",
            host=host,
        )


async def cmd_top(args: argparse.Namespace) -> int:
    if args.interval < 0.5:
        raise UsageError("--interval takes seconds between redraws, at least 0.5")
    operators_only(args, "the state `reach top` shows")
    async with (
        broker_of(args, name="reach-top") as broker,
        Board(broker, _history(args)) as board,
    ):
        if args.once:  # one look: at the whole window, not at what was read by then
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(board.history_read.wait(), HISTORY_WAIT_S)
            await board.refresh()
            print(render(board.snapshot()))
            return 0
        return await redraw_until_interrupted(lambda: _refreshed(board), args.interval)


async def _refreshed(board: Board) -> str:
    await board.refresh()
    return render(board.snapshot())


def _version() -> str:
    try:
        return importlib.metadata.version("agentreach")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
