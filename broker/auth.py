"""How a party proves who it is to NATS: a creds file (JWT and seed), an nkey seed, a token,
a user and password, TLS with a client certificate — the ways the ``nats`` CLI takes, read
from the same environment variables.

Secrets come from files or the environment, never from the command line (``ps`` shows
it), and never reach a log line or an error message.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from agentreach.broker.errors import UnusableCredentials

_CREDS_JWT = "-----BEGIN NATS USER JWT-----"


class AuthConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Credentials in a config file, as paths: the secrets themselves stay in their files.

    broker:
      auth: {creds: /etc/reach/creds/coordinator.creds, tls_ca: /etc/reach/tls/ca.pem}
    """

    creds: str | None = None
    nkey: str | None = None
    token_file: str | None = None
    user: str | None = None
    password_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_first: bool = False

    def auth(self) -> Auth:
        """The :class:`Auth` these paths make; raises UnusableCredentials naming a missing file."""

        def path(value: str | None) -> Path | None:
            return Path(value) if value else None

        def secret(value: str | None, what: str) -> str | None:
            return _readable(Path(value), what).read_text().strip() if value else None

        return Auth(
            creds=path(self.creds),
            nkey=path(self.nkey),
            token=secret(self.token_file, "broker.auth.token_file"),
            user=self.user,
            password=secret(self.password_file, "broker.auth.password_file"),
            tls_ca=path(self.tls_ca),
            tls_cert=path(self.tls_cert),
            tls_key=path(self.tls_key),
            tls_first=self.tls_first,
        )


@dataclass(frozen=True, kw_only=True)
class Auth:
    """Credentials for one connection; every field is optional, none means an open server."""

    creds: Path | None = None  # a .creds file: the user JWT and its nkey seed
    nkey: Path | None = None  # a file holding an nkey seed (SU…)
    token: str | None = None
    user: str | None = None
    password: str | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_first: bool = False  # TLS before the NATS handshake (servers with handshake_first)

    def __post_init__(self) -> None:
        # A path given as a string (Auth(creds="billing.creds")) is a path all the same.
        for name in ("creds", "nkey", "tls_ca", "tls_cert", "tls_key"):
            if isinstance(value := getattr(self, name), str):
                object.__setattr__(self, name, Path(value))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Auth:
        """The ``nats`` CLI's variables: NATS_CREDS, NATS_NKEY, NATS_TOKEN, NATS_USER,
        NATS_PASSWORD, NATS_CA, NATS_CERT, NATS_KEY."""
        env = os.environ if environ is None else environ

        def path(name: str) -> Path | None:
            return Path(env[name]) if env.get(name) else None

        return cls(
            creds=path("NATS_CREDS"),
            nkey=path("NATS_NKEY"),
            token=env.get("NATS_TOKEN") or None,
            user=env.get("NATS_USER") or None,
            password=env.get("NATS_PASSWORD") or None,
            tls_ca=path("NATS_CA"),
            tls_cert=path("NATS_CERT"),
            tls_key=path("NATS_KEY"),
        )

    def merged(self, other: Auth) -> Auth:
        """This auth, with what it leaves unset taken from ``other`` (flags over env)."""
        fields = {
            name: value if value not in (None, False) else getattr(other, name)
            for name, value in vars(self).items()
        }
        return Auth(**fields)

    @property
    def identity(self) -> str | None:
        """The user name the creds file's JWT carries (the party's name), if any."""
        if self.creds is None:
            return None
        return user_name_of(self.creds)

    @property
    def role(self) -> str | None:
        """The role of the creds (agent, caller, worker, …), when ``reach auth`` issued them."""
        return None if self.creds is None else role_of(self.creds)

    def connect_options(self, servers: list[str]) -> dict[str, Any]:
        """The nats-py ``connect`` options; raises UnusableCredentials naming a missing file."""
        options: dict[str, Any] = {}
        if self.creds is not None:
            options["user_credentials"] = str(_creds_file(self.creds))
        if self.nkey is not None:
            options["nkeys_seed"] = str(_readable(self.nkey, "nkey seed file"))
        if self.token is not None:
            options["token"] = self.token
        if self.user is not None:
            options["user"], options["password"] = self.user, self.password or ""
        if self.tls_ca or self.tls_cert or any(s.startswith("tls://") for s in servers):
            options["tls"] = self._tls_context()
            options["tls_handshake_first"] = self.tls_first
        if self.identity:
            # Replies and API answers land under the party's own inbox prefix, which the
            # server lets nobody else read.
            options["inbox_prefix"] = f"_INBOX_{self.identity}"
        return options

    def _tls_context(self) -> ssl.SSLContext:
        cafile = str(_readable(self.tls_ca, "TLS CA file")) if self.tls_ca else None
        context = ssl.create_default_context(cafile=cafile)
        if self.tls_cert or self.tls_key:
            if not (self.tls_cert and self.tls_key):
                raise UnusableCredentials(
                    "a TLS client certificate needs both --tls-cert and --tls-key"
                )
            cert = _readable(self.tls_cert, "TLS certificate")
            key = _readable(self.tls_key, "TLS key")
            context.load_cert_chain(str(cert), str(key))
        return context


def user_name_of(creds: Path) -> str | None:
    """The ``name`` claim of the user JWT in a creds file (read, not verified: the server
    verifies it; we only need the name for the inbox prefix)."""
    name = _claims_of(creds).get("name")
    return name if isinstance(name, str) else None


PARTIES = frozenset({"agent", "caller", "worker"})  # the roles that are not the service's


def role_of(creds: Path) -> str | None:
    """The role ``reach auth`` issued the creds for (their ``role:<role>`` tag), if any."""
    nats = _claims_of(creds).get("nats")
    tags = nats.get("tags") if isinstance(nats, dict) else None
    found = (t for t in tags or [] if isinstance(t, str) and t.startswith("role:"))
    return next((tag.removeprefix("role:") for tag in found), None)


def expiry_of(creds: Path) -> datetime | None:
    """When the user JWT in a creds file expires (its ``exp``, read and not verified: it is
    the user's own), in UTC; None when it never does or cannot be read."""
    exp = _claims_of(creds).get("exp")
    if not isinstance(exp, int) or isinstance(exp, bool):
        return None
    return datetime.fromtimestamp(exp, tz=UTC)


def _claims_of(creds: Path) -> dict[str, Any]:
    """The claims of the user JWT in a creds file, unverified; {} when there is none."""
    try:
        text = creds.read_text()
    except OSError:
        return {}
    if _CREDS_JWT not in text:
        return {}
    token = text.split(_CREDS_JWT, 1)[1].split("-----", 1)[0].strip().strip("-").strip()
    try:
        claims_b64 = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(claims_b64 + "=" * (-len(claims_b64) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _creds_file(path: Path) -> Path:
    """``path``, once it looks like a creds file: a user JWT and an nkey seed, each between
    its ``-----BEGIN …-----`` lines (nats-py's own error for anything else means nothing)."""
    text = _readable(path, "creds file").read_text(errors="replace")
    if _CREDS_JWT not in text or "-----BEGIN USER NKEY SEED-----" not in text:
        raise UnusableCredentials(
            f"creds file {path} is not a NATS .creds file (no user JWT and nkey seed in it;"
            " make one with `reach auth agent|caller|worker|operator NAME`)"
        )
    return path


def _readable(path: Path, what: str) -> Path:
    if not path.is_file():
        raise UnusableCredentials(f"{what} {path} does not exist")
    if not os.access(path, os.R_OK):
        raise UnusableCredentials(f"{what} {path} cannot be read")
    return path
