"""The auth directory: every key, JWT and creds file of one Agent-Reach deployment.

Decentralized JWT auth: an operator signs two accounts (``SYS`` for the server's own use,
``REACH`` for every party); ``REACH`` lists one *scoped* signing key per role, and a user
signed by a role key gets that role's template (:mod:`agentreach.auth.roles`). Issuing a
user is an offline act — the server checks the chain when the user connects — so adding an
agent or a caller needs no restart. Account changes (revocations) are pushed to the running
servers (``$SYS.REQ.CLAIMS.UPDATE``, the full resolver keeps them on every node), and the
intents each agent may serve and the priorities each party may send tasks at to the
allowances bucket (:mod:`agentreach.coordinator.routing.allowances`).

Layout (secrets 0600 in 0700 directories)::

    registry.json                  names → role, public key, issued at, the priorities it
                                   may send at (an agent's: the intents it may serve too);
                                   names are unique
    operator/operator.nk, .jwt     the operator identity: the seed may go offline after init
    operator/signing.nk            signs the account JWTs (each revocation)
    accounts/{SYS,REACH}.{nk,jwt}  the accounts (their keys name them in every JWT)
    signing/<role>.nk              one scoped signing key per role, and sys.nk
    creds/<role>/<name>.creds      what each party connects with (``--creds``)
    creds/sys/push.creds           the system user of ``reach auth push``
    coordinator.seal               the coordinator replicas' shared key for grants
    server/auth.conf               included by the nats-server config
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from agentreach.auth import jwt, roles
from agentreach.auth.jwt import Key
from agentreach.broker import Auth, Broker, Names, NoResponders
from agentreach.envelopes import PRIORITIES, Priority
from agentreach.errors import ReachError

ACCOUNT = "REACH"
CLAIMS_UPDATE = "$SYS.REQ.CLAIMS.UPDATE"  # where the servers take an account's new JWT
ANY_INTENT = "*"  # the pattern that allows every intent
COORDINATOR = "coordinator"
ADMIN = "admin"
SENDERS = ("agent", "caller", "worker", "operator")  # the roles that send tasks as themselves
# A new caller's priorities: P0 only when given (it is the fast lane). Agents' sub-tasks keep
# the priority of the task they serve, workers replay at a letter's: those get every one.
NEW_CALLER_PRIORITIES: tuple[Priority, ...] = ("P1", "P2")


class AuthError(ReachError):
    """A mistake with the auth directory or a name; the message says which."""


class AuthDirectory:
    """Creates and reads an auth directory (see the module's documentation)."""

    def __init__(self, root: Path | str, *, names: Names | None = None) -> None:
        self.root = Path(root)
        self.names = names or Names()

    # -- paths ----------------------------------------------------------------------
    @property
    def server_config(self) -> Path:
        return self.root / "server" / "auth.conf"

    @property
    def seal_key(self) -> Path:
        return self.root / "coordinator.seal"

    def creds(self, role: str, name: str) -> Path:
        return self.root / "creds" / role / f"{name}.creds"

    @property
    def exists(self) -> bool:
        return (self.root / "operator" / "operator.jwt").exists()

    # -- init -----------------------------------------------------------------------
    def init(self, *, resolver_dir: Path | None = None) -> None:
        """Operator, accounts, role keys, the coordinator's and an ``admin``'s creds, the seal
        key and the server include. Refuses to overwrite an existing directory."""
        if self.exists:
            raise AuthError(f"{self.root} already holds an operator; refusing to overwrite it")
        operator = self._new_key("operator/operator.nk", "operator")
        operator_signing = self._new_key("operator/signing.nk", "operator")
        system = self._new_key("accounts/SYS.nk", "account")
        self._new_key(f"accounts/{ACCOUNT}.nk", "account")
        for role in roles.ROLES:
            self._new_key(f"signing/{role}.nk", "account")
        system_signing = self._new_key("signing/sys.nk", "account")
        self._write(
            "operator/operator.jwt",
            jwt.encode(
                jwt.operator_claims(
                    "agent-reach",
                    operator,
                    signing_key=operator_signing.public,
                    system_account=system.public,
                ),
                operator,
            ),
        )
        self._write(
            "accounts/SYS.jwt",
            jwt.encode(
                jwt.account_claims(
                    "SYS", system, signing_keys=[system_signing.public], jetstream=False
                ),
                operator_signing,
            ),
        )
        self._save_registry({"users": {}, "revoked": {}})
        self.write_account()
        jwt.write_secret(self.seal_key, secrets.token_hex(32) + "\n")
        self._issue_push_user(system, system_signing)
        self.write_server_config(resolver_dir=resolver_dir)
        self.issue("coordinator", COORDINATOR)
        self.issue("operator", ADMIN)

    def _issue_push_user(self, system: Key, signing: Key) -> None:
        push = Key.new("user")
        claims = jwt.user_claims(
            "push", push.public, issuer_account=system.public, permissions={"pub": {}, "sub": {}}
        )
        jwt.write_creds(self.creds("sys", "push"), jwt.encode(claims, signing), push)

    def write_account(self) -> str:
        """(Re-)sign the REACH account: JetStream on, a scoped key per role, revocations."""
        scoped = [
            jwt.scoped_signing_key(
                self._key(f"signing/{role}.nk"), role, roles.permissions(role, self.names)
            )
            for role in roles.ROLES
        ]
        token = jwt.encode(
            jwt.account_claims(
                ACCOUNT,
                self._key(f"accounts/{ACCOUNT}.nk"),
                signing_keys=scoped,  # type: ignore[arg-type]
                jetstream=True,
                revocations=self._registry()["revoked"],
            ),
            self._key("operator/signing.nk"),
        )
        self._write(f"accounts/{ACCOUNT}.jwt", token)
        return token

    def write_server_config(self, *, resolver_dir: Path | None = None) -> Path:
        """``server/auth.conf`` (see :meth:`server_config_text`)."""
        text = self.server_config_text(resolver_dir or self.root / "server" / "jwt")
        return jwt.write_secret(self.server_config, text)

    def server_config_text(self, resolver_dir: Path) -> str:
        """What a nats-server includes: trust the operator, keep accounts with the full
        resolver in ``resolver_dir`` (pushed updates apply at once and survive restarts),
        both accounts preloaded. Public JWTs only, no seed."""
        system = self._key("accounts/SYS.nk").public
        reach = self._key(f"accounts/{ACCOUNT}.nk").public
        return f"""# Made by `reach auth init`: decentralized JWT auth for Agent-Reach.
# Include it from the nats-server config (`include auth.conf`). It holds public JWTs only.
operator: {self._read("operator/operator.jwt")}
system_account: {system}
resolver: {{
  type: full
  dir: "{resolver_dir.resolve()}"
  allow_delete: false
  interval: "2m"
  timeout: "1.9s"
}}
resolver_preload: {{
  {system}: {self._read("accounts/SYS.jwt")}
  {reach}: {self._read(f"accounts/{ACCOUNT}.jwt")}
}}
"""

    # -- users ----------------------------------------------------------------------
    def issue(
        self,
        role: str,
        name: str,
        *,
        expires_s: int | None = None,
        intents: tuple[str, ...] | None = None,
        priorities: tuple[Priority, ...] | None = None,
    ) -> Path:
        """A new user of ``role`` called ``name``: a new nkey, a JWT signed by the role's
        key, a creds file. No server is touched. Issuing a name again replaces its creds
        (the old ones keep working until revoked). An agent may serve ``intents``
        (patterns, see :mod:`agentreach.coordinator.routing.allowances`): a new agent given
        none may serve nothing, one issued again keeps what it had; ``reach auth push``
        applies them. Tasks it sends may have ``priorities``: a new caller given none P1 and
        P2, any other party every priority; one issued again keeps what it had."""
        self._require()
        if role not in roles.ROLES:
            raise AuthError(f"unknown role {role!r}: one of {', '.join(roles.ROLES)}")
        if intents is not None and role != "agent":
            raise AuthError(f"only agents serve intents; {name!r} would be a {role}")
        if priorities is not None and role not in SENDERS:
            raise AuthError(f"a {role} sends no tasks of its own: no priorities for {name!r}")
        try:
            roles.check_name(name, role)
        except ValueError as exc:
            raise AuthError(str(exc)) from None
        registry = self._registry()
        known = registry["users"].get(name)
        if known and known["role"] != role:
            raise AuthError(
                f"{name!r} is already issued as {known['role']}; names are unique across roles"
            )
        user = Key.new("user")
        claims = jwt.user_claims(
            name,
            user.public,
            issuer_account=self._key(f"accounts/{ACCOUNT}.nk").public,
            tags=[f"role:{role}"],
            expires_s=expires_s,
        )
        path = jwt.write_creds(
            self.creds(role, name), jwt.encode(claims, self._key(f"signing/{role}.nk")), user
        )
        issued = [*known.get("keys", []), user.public] if known else [user.public]
        entry: dict[str, Any] = {"role": role, "keys": issued, "issued_at": int(time.time())}
        if role == "agent":
            # Without the field (an agent issued before allowances existed) push allows any.
            kept = known.get("intents") if known else []
            entry["intents"] = list(intents) if intents is not None else kept
            if entry["intents"] is None:
                del entry["intents"]
        if role in SENDERS:
            # Without the field (issued before priorities existed) push allows every one.
            new = NEW_CALLER_PRIORITIES if role == "caller" else PRIORITIES
            kept = known.get("priorities") if known else list(new)
            entry["priorities"] = list(priorities) if priorities is not None else kept
            if entry["priorities"] is None:
                del entry["priorities"]
        registry["users"][name] = entry
        self._save_registry(registry)
        return path

    def allow(
        self,
        name: str,
        intents: tuple[str, ...] | None = None,
        *,
        priorities: tuple[Priority, ...] | None = None,
    ) -> None:
        """Replace what agent ``name`` may serve, and/or the priorities party ``name`` may
        send tasks at (then ``reach auth push``)."""
        self._require()
        registry = self._registry()
        user = registry["users"].get(name)
        if user is None:
            raise AuthError(f"{name!r} is no user in {self.root}")
        if intents is not None and user["role"] != "agent":
            raise AuthError(
                f"{name!r} is a {user['role']}, not an agent, in {self.root}: only agents"
                " serve intents"
            )
        if priorities is not None and user["role"] not in SENDERS:
            raise AuthError(f"{name!r} is the {user['role']}: it sends no tasks of its own")
        if intents is not None:
            user["intents"] = list(intents)
        if priorities is not None:
            user["priorities"] = list(priorities)
        self._save_registry(registry)

    def intents_of(self, name: str) -> tuple[str, ...]:
        """What agent ``name`` may serve: an agent issued before allowances existed, any."""
        user = self._registry()["users"].get(name, {})
        return tuple(user.get("intents", [ANY_INTENT]))

    def priorities_of(self, name: str) -> tuple[Priority, ...]:
        """The priorities ``name`` may send tasks at: one issued before they existed, any."""
        user = self._registry()["users"].get(name, {})
        return tuple(user.get("priorities", PRIORITIES))

    def sender_priorities(self) -> dict[str, tuple[Priority, ...] | None]:
        """Every sending party's priorities for the bucket; None for a revoked one."""
        return {
            name: None if self.revoked(name) else self.priorities_of(name)
            for name, user in self._registry()["users"].items()
            if user["role"] in SENDERS
        }

    def allowances(self) -> dict[str, tuple[str, ...] | None]:
        """Every agent's allowance for the bucket; None for a revoked one (its key goes)."""
        return {
            name: None if self.revoked(name) else self.intents_of(name)
            for name, user in self._registry()["users"].items()
            if user["role"] == "agent"
        }

    def revoke(self, name: str) -> None:
        """Revoke every JWT issued to ``name`` so far (re-signs the account: then push)."""
        self._require()
        registry = self._registry()
        user = registry["users"].get(name)
        if user is None:
            raise AuthError(f"no user called {name!r} in {self.root}")
        now = int(time.time())
        for key in user["keys"]:  # covers JWTs of that key issued up to now
            registry["revoked"][key] = now
        self._save_registry(registry)
        self.write_account()

    def account_token(self) -> str:
        """The current REACH account JWT (public: what ``push`` sends)."""
        return self._read(f"accounts/{ACCOUNT}.jwt")

    def users(self) -> dict[str, dict[str, Any]]:
        return dict(self._registry()["users"])

    def keys_of(self, name: str) -> list[str]:
        """The public keys issued to ``name``, the newest last (the server logs a user by it)."""
        return list(self._registry()["users"].get(name, {}).get("keys", []))

    def name_of_key(self, key: str) -> str | None:
        """Whose public user key ``key`` is (any issued, not only the newest), or None."""
        for name, user in self._registry()["users"].items():
            if key in user.get("keys", []):
                return str(name)
        return None

    def role_of(self, name: str) -> str:
        user = self._registry()["users"].get(name)
        if user is None:
            raise AuthError(f"no user called {name!r} in {self.root}")
        return str(user["role"])

    def revoked(self, name: str) -> bool:
        user = self._registry()["users"].get(name, {})
        return bool(user) and all(k in self._registry()["revoked"] for k in user["keys"])

    # -- files ----------------------------------------------------------------------
    def _require(self) -> None:
        if self.exists:
            return
        if self.root.is_dir() and any(self.root.iterdir()):
            raise AuthError(
                f"{self.root} is an incomplete auth directory: operator/operator.jwt is missing."
                " Restore it from your copy; `reach auth init` elsewhere would make a new"
                " operator, and no creds issued so far would work with it"
            )
        raise AuthError(
            f"{self.root} is not an auth directory: pass --dir (or set REACH_AUTH_DIR) to"
            " yours, or run `reach auth init` to make one"
        )

    def _new_key(self, relative: str, kind: jwt.KeyKind) -> Key:
        key = Key.new(kind)
        self._write(relative, key.seed)
        return key

    def _key(self, relative: str) -> Key:
        return Key.from_seed(self._read(relative))

    def _read(self, relative: str) -> str:
        try:
            return (self.root / relative).read_text().strip()
        except OSError as exc:
            raise AuthError(f"{self.root / relative}: {exc.strerror}") from None

    def _write(self, relative: str, text: str) -> None:
        jwt.write_secret(self.root / relative, text + "\n")

    def _registry(self) -> dict[str, Any]:
        path = self.root / "registry.json"
        return json.loads(path.read_text()) if path.exists() else {"users": {}, "revoked": {}}

    def _save_registry(self, registry: dict[str, Any]) -> None:
        jwt.write_secret(self.root / "registry.json", json.dumps(registry, indent=2) + "\n")


async def push(directory: AuthDirectory, nats_url: str | None, *, auth: Auth | None = None) -> str:
    """Send the REACH account JWT to the running servers, re-signed first with the role
    templates of this version: revocations and changed templates (an upgrade's: a caller's
    workflow cancels, say) apply at once, without a restart. A directory without the
    signing keys (a copy made for pushing) sends the JWT as it is. Returns the server's
    answer."""
    directory._require()
    credentials = auth or Auth(creds=directory.creds("sys", "push"))
    try:
        token = directory.write_account()
    except AuthError:  # a signing key is not here: what was signed last is what there is
        token = directory.account_token()
    async with Broker(nats_url, name="reach-auth-push", auth=credentials) as broker:
        try:
            answer = await broker.request(CLAIMS_UPDATE, token.encode(), timeout=5.0)
        except NoResponders:  # only the system account's users reach the server's subjects
            raise AuthError(
                f"reach auth push needs the system account's creds:"
                f" {directory.creds('sys', 'push')} (the default; --creds {credentials.creds}"
                f" is not a system user: nobody answers it on {CLAIMS_UPDATE!r})"
            ) from None
    reply = json.loads(answer.data)
    if "error" in reply:
        raise AuthError(f"the server refused the account update: {reply['error']}")
    return str(reply.get("data", {}).get("message", reply))
