"""``reach auth``: the identities and permissions of a secured deployment.

    reach auth init                 operator, accounts, role keys, coordinator + admin creds,
                                    the seal key and the nats-server include (auth.conf)
    reach auth agent|caller|worker|operator NAME [--expires S]
                                    a creds file for one party; no server restart, no push
    reach auth revoke NAME          revoke its creds (then `reach auth push`)
    reach auth push                 send the account to the running servers
    reach auth show NAME            what NAME may publish and subscribe
    reach auth list                 every name issued, with its role

Secrets are written 0600 and never printed: the commands print paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from agentreach.auth import AuthDirectory, expanded, push
from agentreach.cli.options import Commands, UsageError, auth_of, names_of

ISSUING = ("agent", "caller", "worker", "operator")
ACTIONS = ("init", *ISSUING, "revoke", "push", "show", "list")
DEFAULT_DIR = "reach-auth"


def register(commands: Commands) -> None:
    auth = commands.add(
        "auth",
        cmd_auth,
        "identities and permissions: init | agent ID | caller NAME | worker NAME"
        " | operator NAME | revoke NAME | push | show NAME | list",
        example=(
            "reach auth init",
            "reach auth agent refund-agent-1 --expires 86400",
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
        return 0
    if args.action == "list":
        for name, user in sorted(directory.users().items()):
            state = " (revoked)" if directory.revoked(name) else ""
            print(f"{user['role']:<12} {name}{state}")
        return 0
    if not args.name:
        raise UsageError(f"auth {args.action} needs a name")
    if args.action in ISSUING:
        path = directory.issue(args.action, args.name, expires_s=args.expires)
        print(f"{args.action} {args.name}: --creds {path}  (no server restart needed)")
    elif args.action == "revoke":
        directory.revoke(args.name)
        print(f"revoked {args.name}; run `reach auth push` to apply it on the servers")
    else:  # show
        role = directory.role_of(args.name)
        print(f"{args.name} ({role}):")
        print(json.dumps(expanded(role, args.name, directory.names), indent=2))
    return 0


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
    print("  next: reach auth agent ID | reach auth caller NAME")
    return 0
