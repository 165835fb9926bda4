"""``reach auth``: the identities and permissions of a secured deployment.

    reach auth init                 operator, accounts, role keys, coordinator + admin creds,
                                    the seal key and the nats-server include (auth.conf)
    reach auth agent|caller|worker|operator NAME [--expires S]
                                    a creds file for one party; no server restart, no push
    reach auth agent NAME --intents a,b
                                    … and the intents that agent may serve (then push)
    reach auth allow NAME --intents a,b
                                    change what agent NAME may serve (then push)
    reach auth revoke NAME          revoke its creds (then `reach auth push`)
    reach auth push                 send the account to the running servers, and every
                                    agent's intents to the allowances bucket
    reach auth show NAME            what NAME may publish and subscribe (and serve)
    reach auth list                 every name issued, with its role (and intents)

An agent issued without --intents may serve none until allowed; one issued again keeps what
it had; one issued before allowances existed may serve any (``*``) until narrowed. Patterns:
an intent's name, ``*`` for any, ``prefix*``.

Secrets are written 0600 and never printed: the commands print paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

from agentreach.auth import AuthDirectory, AuthError, expanded, push
from agentreach.auth.directory import ADMIN
from agentreach.broker import Auth, Broker, provision
from agentreach.cli.options import Commands, UsageError, auth_of, names_of
from agentreach.coordinator.routing import allowances as allowed

ISSUING = ("agent", "caller", "worker", "operator")
ACTIONS = ("init", *ISSUING, "allow", "revoke", "push", "show", "list")
DEFAULT_DIR = "reach-auth"


def register(commands: Commands) -> None:
    auth = commands.add(
        "auth",
        cmd_auth,
        "identities and permissions: init | agent ID | caller NAME | worker NAME"
        " | operator NAME | allow ID | revoke NAME | push | show NAME | list",
        example=(
            "reach auth init",
            "reach auth agent refund-agent-1 --intents refund_application --expires 86400",
            "reach auth allow refund-agent-1 --intents refund_application,refund_status",
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


async def cmd_auth(args: argparse.Namespace) -> int:
    directory = AuthDirectory(args.dir, names=names_of(args))
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
        for name, intents in changed.items():
            print(f"  {name}: {'allowance removed' if intents == 'revoked' else intents}")
        print(f"pushed the allowances: {len(changed)} changed")
        return 0
    if args.action == "list":
        for name, user in sorted(directory.users().items()):
            state = " (revoked)" if directory.revoked(name) else ""
            serves = ""
            if user["role"] == "agent":
                serves = f"  intents: {allowed.shown(directory.intents_of(name))}"
            print(f"{user['role']:<12} {name}{state}{serves}")
        return 0
    if not args.name:
        raise UsageError(f"auth {args.action} needs a name")
    intents = _intents(args)
    if args.action in ISSUING:
        path = directory.issue(args.action, args.name, expires_s=args.expires, intents=intents)
        print(f"{args.action} {args.name}: --creds {path}  (no server restart needed)")
        if args.action == "agent":
            _say_serves(directory, args.name)
    elif args.action == "allow":
        if intents is None:
            raise UsageError("auth allow needs --intents (a comma-separated list; '' for none)")
        directory.allow(args.name, intents)
        _say_serves(directory, args.name)
    elif args.action == "revoke":
        directory.revoke(args.name)
        print(f"revoked {args.name}; run `reach auth push` to apply it on the servers")
    else:  # show
        role = directory.role_of(args.name)
        serves = ""
        if role == "agent":
            serves = f"; may serve: {allowed.shown(directory.intents_of(args.name))}"
        print(f"{args.name} ({role}{serves}):")
        print(json.dumps(expanded(role, args.name, directory.names), indent=2))
    return 0


def _intents(args: argparse.Namespace) -> tuple[str, ...] | None:
    if args.intents is None:
        return None
    if args.action not in ("agent", "allow"):
        raise UsageError(f"--intents is for `auth agent` and `auth allow`, not {args.action}")
    try:
        return allowed.parse(args.intents)
    except ValueError as exc:
        raise AuthError(f"--intents: {exc}") from None


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
    print(f"  nats-server:  include {directory.server_config.resolve()}")
    print(f"  coordinator:  --creds {directory.creds('coordinator', 'coordinator')}")
    print(f"                security.seal_key_file: {directory.seal_key}")
    print(f"  operators:    --creds {directory.creds('operator', 'admin')}")
    print("  next: reach auth agent ID --intents a,b | reach auth caller NAME; reach auth push")
    return 0


async def push_allowances(
    directory: AuthDirectory, nats_url: str | None, *, auth: Auth | None = None
) -> dict[str, str]:
    """Write every agent's allowance to the allowances bucket (made if missing) as the
    directory's ``admin`` (or ``auth``), and delete those of revoked agents. Returns what
    changed: agent → its intents as written, or ``revoked``."""
    credentials = auth or Auth(creds=directory.creds("operator", ADMIN))
    wanted = directory.allowances()
    now = int(time.time() * 1000)
    changed: dict[str, str] = {}
    async with Broker(
        nats_url, names=directory.names, name="reach-auth-allow", auth=credentials
    ) as broker:
        await provision(broker, allowed.topology(broker.names), patience_s=10.0)
        bucket = await broker.bucket(allowed.bucket_name(broker.names), allowed.Allowance)
        stored = await bucket.snapshot()
        for name, intents in sorted(wanted.items()):
            current = stored.get(name)
            if intents is None:
                if current is not None:
                    await bucket.delete(name)
                    changed[name] = "revoked"
                continue
            if current is not None and current.value.intents == intents:
                continue
            record = allowed.Allowance(agent_id=name, intents=intents, set_at=now)
            await bucket.put(name, record)
            changed[name] = allowed.shown(intents)
    return changed
