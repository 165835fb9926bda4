"""``reach routes reload`` (every coordinator replica answers) and ``reach routes check FILE``."""

from __future__ import annotations

import argparse
import sys

from agentreach.broker.requests import gather_replies
from agentreach.cli.options import (
    Commands,
    MissingArgument,
    UsageError,
    broker_of,
    non_negative_seconds,
    operators_only,
)
from agentreach.cli.status import NOT_RUNNING
from agentreach.coordinator import ConfigError, load_config
from agentreach.coordinator.workflows.nesting import check_nesting
from agentreach.envelopes import ReloadReply, decode_as


def register(commands: Commands) -> None:
    routes = commands.add(
        "routes",
        cmd_routes,
        "routing rules: reload (every replica) | check FILE",
        example=("reach routes check deploy/coordinator/coordinator.yaml", "reach routes reload"),
    )
    routes.add_argument(
        "action",
        choices=["reload", "check"],
        help="reload: every coordinator re-reads its rules; check: validate a file offline",
    )
    routes.add_argument("file", nargs="?", help="the coordinator config to check")
    routes.add_argument(
        "--wait",
        type=non_negative_seconds,
        default=1.0,
        help="seconds to collect replicas' answers (reload)",
    )


async def cmd_routes(args: argparse.Namespace) -> int:
    if args.action == "check":
        return _check(args.file)
    operators_only(args, "a routing reload")
    async with broker_of(args) as broker:
        answers = await gather_replies(broker, broker.names.routes_reload, wait_s=args.wait)
    if not answers:
        raise UsageError(NOT_RUNNING)
    failed = 0
    replies = [decode_as(answer, ReloadReply) for answer in answers]
    for reply in replies:
        if reply.ok:
            print(f"{reply.replica}: reloaded {len(reply.rules)} rules: {', '.join(reply.rules)}")
        else:
            failed += 1
            print(f"{reply.replica}: not reloaded: {reply.error}")
        if reply.restart_for:
            print(
                f"{reply.replica}: changed, applied at its next start only:"
                f" {', '.join(reply.restart_for)}",
                file=sys.stderr,
            )
    _say_different_files(replies)
    return 1 if failed else 0


def _say_different_files(replies: list[ReloadReply]) -> None:
    """Replicas that read different config files (a copy left behind) route differently."""
    digests = {r.replica: r.config_sha256[:12] for r in replies if r.config_sha256}
    if len(set(digests.values())) > 1:
        each = ", ".join(f"{replica} {digest}" for replica, digest in sorted(digests.items()))
        print(
            f"warning: the replicas read different config files (SHA-256: {each})", file=sys.stderr
        )


def _check(path: str | None) -> int:
    if not path:
        raise MissingArgument("routes check needs the config file to check")
    config = load_config(path)
    try:
        check_nesting(config.workflows)  # what the coordinator refuses at start
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    routing = config.routing
    for rule in routing.rules:
        print(f"{rule.name:<24} {'fallback' if rule.fallback else rule.match.topic}")
    print(f"{path}: {len(routing.rules)} rules, fallback {routing.fallback.name!r}")
    warned = 0
    for name, spec in config.workflows.items():
        size = len(spec.states.states) if spec.states else len(spec.graph())
        noun = ("state" if spec.states else "step") + ("" if size == 1 else "s")
        print(f"workflow {name:<15} {spec.form}, {size} {noun}")
        for warning in spec.warnings():
            warned += 1
            print(f"{path}: warning: workflow {name!r}: {warning}", file=sys.stderr)
    if warned:
        print(f"{path}: {warned} warning{'s' if warned > 1 else ''} (it loads)", file=sys.stderr)
    return 0
