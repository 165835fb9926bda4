"""``reach auth``: the identities and permissions of a secured deployment.

    reach auth init                 operator, accounts, role keys, coordinator + admin creds,
                                    the seal key and the nats-server include (auth.conf)
    reach auth agent|caller|worker|operator NAME [--expires S]
                                    a creds file for one party; no server restart, no push
    reach auth agent NAME --intents a,b
                                    … and the intents that agent may serve (then push)
    reach auth allow NAME --intents a,b
                                    change what agent NAME may serve (then push)
    reach auth caller NAME --priorities P0,P1,P2
    reach auth allow NAME --priorities P1,P2
                                    the priorities NAME's tasks may have (then push)
    reach auth revoke NAME          revoke its creds (then `reach auth push`)
    reach auth push                 send the account to the running servers, and every
                                    agent's intents and every party's priorities to the
                                    allowances bucket; as the system account's user
                                    (creds/sys/push.creds; --creds names another of its users)
    reach auth show NAME            what NAME may publish and subscribe (and serve, send at)
    reach auth list                 every name issued, with its role (intents, priorities,
                                    when its creds expire)

An agent issued without --intents may serve none until allowed; one issued again keeps what
it had; one issued before allowances existed may serve any (``*``) until narrowed. Patterns:
an intent's name, ``*`` for any, ``prefix*``.

A new caller may send P1 and P2 tasks until given P0 (``--priorities``); agents (their
sub-tasks), workers (their replays) and operators any priority; anyone issued again keeps
what it had, anyone issued before priorities existed every one until narrowed. A secured
coordinator refuses a task above its sender's (error ``priority_not_allowed``).

Secrets are written 0600 and never printed: the commands print paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from agentreach.auth import AuthDirectory, AuthError, expanded, push
from agentreach.auth.directory import ADMIN, SENDERS
from agentreach.broker import Auth, Broker, Bucket, provision
from agentreach.broker.auth import expiry_of
from agentreach.cli.options import Commands, MissingArgument, UsageError, auth_of, names_of
from agentreach.coordinator.routing import allowances as allowed
from agentreach.envelopes import Priority

ISSUING = ("agent", "caller", "worker", "operator")
USER_KEY = re.compile(r"U[A-Z2-7]{55}")  # an nkey's public user key, as nats-server logs it
ACTIONS = ("init", *ISSUING, "allow", "revoke", "push", "show", "list")
DEFAULT_DIR = "reach-auth"


def register(commands: Commands) -> None:
    auth = commands.add(
        "auth",
        cmd_auth,
        "identities and permissions: init | agent ID | caller NAME | worker NAME"
        " | operator NAME | allow NAME | revoke NAME | push | show NAME|USER_KEY | list",
        example=(
            "reach auth init",
            "reach auth agent refund-agent-1 --intents refund_application --expires 86400",
            "reach auth allow refund-agent-1 --intents refund_application,refund_status",
            "reach auth caller checkout --priorities P0,P1,P2",
            "reach auth push",
            "reach auth revoke refund-agent-1",
        ),
    )
    auth.add_argument("action", choices=ACTIONS, help="what to do: " + " | ".join(ACTIONS))
    auth.add_argument("name", nargs="?", help="the party's name (an agent's: its agent_id)")
    auth.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("REACH_AUTH_DIR") or DEFAULT_DIR),
        help=f"the auth directory, which holds secrets (default $REACH_AUTH_DIR, ./{DEFAULT_DIR})",
    )
    auth.add_argument(
        "--expires", type=int, default=None, help="seconds until the new creds expire"
    )
    auth.add_argument(
        "--intents",
        default=None,
        help="agent, allow: the intents the agent may serve, comma-separated ('*' any,"
        " 'prefix*'; '' none); a new agent without it serves none",
    )
    auth.add_argument(
        "--priorities",
        default=None,
        help="agent, caller, worker, operator, allow: the priorities its tasks may have,"
        " comma-separated (P0,P1,P2); a new caller without it P1,P2, others all",
    )


async def cmd_auth(args: argparse.Namespace) -> int:
    directory = AuthDirectory(args.dir, names=names_of(args))
    intents, priorities = _intents(args), _priorities(args)
    if args.action == "init":
        return _init(directory)
    if args.action == "push":
        # As the directory's system user (not $NATS_CREDS, a party's own), unless --creds
        # names another; TLS as the flags and the environment say.
        system_user = args.creds or directory.creds("sys", "push")
        auth = dataclasses.replace(
            auth_of(args), creds=system_user, nkey=None, token=None, user=None, password=None
        )
        message = await push(directory, args.nats_url, auth=auth)
        print(f"pushed the account: {message}")
        # Allowances are KV in the REACH account: written as the directory's admin.
        admin = dataclasses.replace(auth, creds=directory.creds("operator", ADMIN))
        changed = await push_allowances(directory, args.nats_url, auth=admin)
        for name, allowance in changed.items():
            print(f"  {name}: {allowance}")  # what it may do now, or revoked
        print(f"pushed the allowances: {len(changed)} changed")
        return 0
    if args.action == "list":
        for name, user in sorted(directory.users().items()):
            state = " (revoked)" if directory.revoked(name) else ""
            serves = ""
            if user["role"] == "agent":
                serves = f"  intents: {allowed.shown(directory.intents_of(name))}"
            if user["role"] in SENDERS:
                serves += f"  priorities: {','.join(directory.priorities_of(name))}"
            expiry = _expiry(directory.creds(user["role"], name))
            print(f"{user['role']:<12} {name}{state}{serves}{expiry}")
        return 0
    if not args.name:
        raise MissingArgument(f"auth {args.action} needs a name")
    if args.action in ISSUING:
        valid_before = args.name in directory.users() and not directory.revoked(args.name)
        path = directory.issue(
            args.action, args.name, expires_s=args.expires, intents=intents, priorities=priorities
        )
        if valid_before:
            _warn_old_creds_valid(args.name)
        print(f"{args.action} {args.name}: --creds {path}  (no server restart needed)")
        if args.action == "agent":
            _say_serves(directory, args.name)
        _say_priorities(directory, args.name)
    elif args.action == "allow":
        if intents is None and priorities is None:
            raise MissingArgument(
                "auth allow needs --intents (a comma-separated list; '' for none)"
                " or --priorities (P0,P1,P2)"
            )
        directory.allow(args.name, intents, priorities=priorities)
        if intents is not None:
            _say_serves(directory, args.name)
        if priorities is not None:
            _say_priorities(directory, args.name)
    elif args.action == "revoke":
        directory.revoke(args.name)
        print(f"revoked {args.name}; run `reach auth push` to apply it on the servers")
    else:
        _show(directory, args.name)
    return 0


def _show(directory: AuthDirectory, name_or_key: str) -> None:
    """A party's role, allowances, keys and permissions; a user key (from the server's log,
    `… - Publish Violation - …`) names its party first."""
    name = name_or_key
    if USER_KEY.fullmatch(name_or_key):
        if (name := directory.name_of_key(name_or_key)) is None:
            raise AuthError(f"no party of {directory.root} was issued the key {name_or_key}")
        newest = directory.keys_of(name)[-1] == name_or_key
        print(f"{name_or_key}: {name}'s {'current key' if newest else 'key, issued again since'}")
    role = directory.role_of(name)
    serves = ""
    if role == "agent":
        serves = f"; may serve: {allowed.shown(directory.intents_of(name))}"
    if role in SENDERS:
        serves += f"; may send: {','.join(directory.priorities_of(name))}"
    keys = directory.keys_of(name)
    serves += f"; key {keys[-1]}" if keys else ""
    print(f"{name} ({role}{'; revoked' if directory.revoked(name) else ''}{serves}):")
    print(json.dumps(expanded(role, name, directory.names), indent=2))


def _warn_old_creds_valid(name: str) -> None:
    """Issuing a name again is no rotation: whoever holds its old creds keeps connecting."""
    print(
        f"reach: warning: {name} was issued before; its old creds stay valid until"
        f" `reach auth revoke {name}` and `reach auth push` (to rotate: revoke, issue again,"
        " hand over the new creds, then push)",
        file=sys.stderr,
    )


def _expiry(creds: Path) -> str:
    """When the creds last issued expire (read from their JWT), for ``auth list``."""
    at = expiry_of(creds)
    if at is None:
        return ""
    return f"  {'expired' if at <= datetime.now(UTC) else 'expires'}: {at:%Y-%m-%d %H:%M:%S} UTC"


def _intents(args: argparse.Namespace) -> tuple[str, ...] | None:
    if args.intents is None:
        return None
    if args.action not in ("agent", "allow"):
        raise UsageError(f"--intents is for `auth agent` and `auth allow`, not {args.action}")
    try:
        return allowed.parse(args.intents)
    except ValueError as exc:
        raise AuthError(f"--intents: {exc}") from None


def _priorities(args: argparse.Namespace) -> tuple[Priority, ...] | None:
    if args.priorities is None:
        return None
    if args.action not in (*SENDERS, "allow"):
        raise UsageError(
            f"--priorities is for `auth caller|agent|worker|operator` and `auth allow`,"
            f" not {args.action}"
        )
    try:
        return allowed.parse_priorities(args.priorities)
    except ValueError as exc:
        raise AuthError(f"--priorities: {exc}") from None


def _say_priorities(directory: AuthDirectory, name: str) -> None:
    if directory.role_of(name) in SENDERS:
        print(
            f"{name} may send: {','.join(directory.priorities_of(name))}"
            "  (run `reach auth push` to apply it)"
        )


def _say_serves(directory: AuthDirectory, name: str) -> None:
    print(
        f"{name} may serve: {allowed.shown(directory.intents_of(name))}"
        "  (run `reach auth push` to apply it)"
    )


def _init(directory: AuthDirectory) -> int:
    directory.init()
    print(
        f"created {directory.root}: keep it private and backed up; only"
        " operator/operator.nk may go offline (issuing and revoking need the rest)"
    )
    # nats-server joins an include path to the including file's directory, absolute or not.
    print(
        f"  nats-server:  copy {directory.server_config} beside your nats-server config,"
        " then in it: include auth.conf"
    )
    print("                (as deploy/nats/secure/*.conf do; nats-server refuses an absolute path)")
    print(f"  coordinator:  --creds {directory.creds('coordinator', 'coordinator')}")
    print(f"                security.seal_key_file: {directory.seal_key}")
    print(f"  operators:    --creds {directory.creds('operator', 'admin')}")
    print("  next: reach auth agent ID --intents a,b | reach auth caller NAME; reach auth push")
    return 0


async def push_allowances(
    directory: AuthDirectory, nats_url: str | None, *, auth: Auth | None = None
) -> dict[str, str]:
    """Write every agent's intents and every party's priorities to the allowances bucket
    (made if missing) as the directory's ``admin`` (or ``auth``): a revoked agent's as
    revoked (``reach agents`` says so of its card), a revoked sender's deleted. Returns what
    changed, by key (an agent's id, ``priorities.<name>``): what was written, or
    ``revoked``."""
    credentials = auth or Auth(creds=directory.creds("operator", ADMIN))
    now = int(time.time() * 1000)
    wanted: dict[str, allowed.Allowance | allowed.SenderPriorities | None] = {}
    for name, intents in directory.allowances().items():
        revoked = intents is None
        wanted[name] = allowed.Allowance(
            agent_id=name, intents=intents or (), set_at=now, revoked=revoked
        )
    for name, priorities in directory.sender_priorities().items():
        record = allowed.SenderPriorities(sender=name, priorities=priorities or (), set_at=now)
        wanted[allowed.priorities_key(name)] = None if priorities is None else record
    async with Broker(
        nats_url, names=directory.names, name="reach-auth-allow", auth=credentials
    ) as broker:
        await provision(broker, allowed.topology(broker.names), patience_s=10.0)
        name = allowed.bucket_name(broker.names)
        agents = await broker.bucket(name, allowed.Allowance)
        senders = await broker.bucket(name, allowed.SenderPriorities)
        stored: dict[str, Any] = await agents.current(
            [key for key in wanted if allowed.sender_of_key(key) is None]
        )
        stored |= await senders.current([k for k in wanted if allowed.sender_of_key(k)])
        return await _written(agents, wanted, stored)


async def _written(
    bucket: Bucket[Any],
    wanted: dict[str, allowed.Allowance | allowed.SenderPriorities | None],
    stored: dict[str, Any],
) -> dict[str, str]:
    """Put the ``wanted`` records that differ from those ``stored`` (ignoring when they were
    set), delete those wanted gone; what changed, by key."""
    changed: dict[str, str] = {}
    for key, record in sorted(wanted.items()):
        current = stored.get(key)
        if record is None:
            if current is not None:
                await bucket.delete(key)
                changed[key] = "revoked"
            continue
        if current is not None and _same(current.value, record):
            continue
        await bucket.put(key, record)
        shown = record.intents if isinstance(record, allowed.Allowance) else record.priorities
        revoked = isinstance(record, allowed.Allowance) and record.revoked
        changed[key] = "revoked" if revoked else allowed.shown(shown)
    return changed


def _same(a: Any, b: Any) -> bool:
    return msgspec.structs.replace(a, set_at=0) == msgspec.structs.replace(b, set_at=0)
