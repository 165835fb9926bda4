"""NATS nkeys and JWTs, made the way nats-server reads them (what ``nsc`` would make).

An nkey is an ed25519 key pair in the NATS encoding (public ``O…``/``A…``/``U…``, seed
``SO…``/``SA…``/``SU…``). A JWT is ``base64url(header).base64url(claims).base64url(signature)``
with header ``{"typ":"JWT","alg":"ed25519-nkey"}``, signed by the issuer's nkey. The server
checks the chain user ← account (signing) key ← operator (signing) key, the times and the
claim types; ``jti`` is computed as the Go library does (it is not checked).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import nkeys

KeyKind = Literal["operator", "account", "user"]
_PREFIXES: dict[KeyKind, int] = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}
_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


@dataclass(frozen=True)
class Key:
    """An nkey pair: ``public`` and ``seed`` (the secret)."""

    public: str
    seed: str

    @classmethod
    def new(cls, kind: KeyKind) -> Key:
        return cls.from_seed(nkeys.encode_seed(os.urandom(32), _PREFIXES[kind]).decode())

    @classmethod
    def from_seed(cls, seed: str) -> Key:
        pair = nkeys.from_seed(seed.encode())
        return cls(public=pair.public_key.decode(), seed=seed)

    def sign(self, data: bytes) -> bytes:
        return nkeys.from_seed(self.seed.encode()).sign(data)

    def __repr__(self) -> str:  # never the seed
        return f"Key({self.public})"


def encode(claims: dict[str, Any], issuer: Key) -> str:
    """``claims`` signed by ``issuer`` (``iss``, ``iat`` and ``jti`` filled in)."""
    claims = {**claims, "iss": issuer.public, "iat": claims.get("iat") or int(time.time())}
    claims.pop("jti", None)
    claims["jti"] = _jti(claims)
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def claims_of(token: str) -> dict[str, Any]:
    """The claims of ``token``, unverified (the server verifies; we read names and keys)."""
    return json.loads(_unb64(token.split(".")[1]))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _jti(claims: dict[str, Any]) -> str:
    body = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    return base64.b32encode(hashlib.new("sha512_256", body).digest()).rstrip(b"=").decode()


# -- claims ---------------------------------------------------------------------------


def operator_claims(
    name: str, operator: Key, *, signing_key: str, system_account: str
) -> dict[str, Any]:
    return {
        "name": name,
        "sub": operator.public,
        "nats": {
            "signing_keys": [signing_key],
            "system_account": system_account,
            # Accounts must be signed by a signing key: the identity key can stay offline.
            "strict_signing_key_usage": True,
            "type": "operator",
            "version": 2,
        },
    }


_UNLIMITED = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
_JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def account_claims(
    name: str,
    account: Key,
    *,
    signing_keys: list[str | dict[str, Any]],
    jetstream: bool,
    revocations: dict[str, int] | None = None,
) -> dict[str, Any]:
    nats: dict[str, Any] = {
        "limits": {**_UNLIMITED, **(_JETSTREAM if jetstream else {})},
        "signing_keys": signing_keys,
        # A user that no scope covers gets nothing.
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account",
        "version": 2,
    }
    if revocations:
        nats["revocations"] = revocations
    return {"name": name, "sub": account.public, "nats": nats}


def scoped_signing_key(key: Key, role: str, permissions: dict[str, Any]) -> dict[str, Any]:
    """An account signing key that issues only users with ``permissions``, a template in
    which ``{{name()}}`` stands for the user's name."""
    return {
        "kind": "user_scope",
        "key": key.public,
        "role": role,
        "template": {**permissions, "subs": -1, "data": -1, "payload": -1},
        "description": f"issues {role} users",
    }


def user_claims(
    name: str,
    user: str,
    *,
    issuer_account: str,
    tags: list[str] | None = None,
    expires_s: int | None = None,
    permissions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A user. Issued by a scoped key it must carry no ``permissions`` (the server refuses
    a scoped user with permissions of its own: the scope's template applies)."""
    nats: dict[str, Any] = {"issuer_account": issuer_account, "type": "user", "version": 2}
    if permissions is not None:
        nats |= permissions | {"subs": -1, "data": -1, "payload": -1}
    if tags:
        nats["tags"] = tags
    claims: dict[str, Any] = {"name": name, "sub": user, "nats": nats}
    if expires_s:
        claims["exp"] = int(time.time()) + expires_s
    return claims


# -- files ----------------------------------------------------------------------------

_CREDS = """-----BEGIN NATS USER JWT-----
{jwt}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
{seed}
------END USER NKEY SEED------

*************************************************************
"""


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` readable by its owner only (0600), in directories only it enters."""
    _private_directory(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        # A file there already keeps its mode through O_TRUNC: a 0644 one stayed readable.
        os.fchmod(file.fileno(), 0o600)
        file.write(text)
    return path


def _private_directory(path: Path) -> None:
    """Create ``path`` and each missing parent 0700 (``mkdir(parents=True)`` would give
    the parents the umask's mode)."""
    if path.is_dir():
        return
    _private_directory(path.parent)
    path.mkdir(mode=0o700)


def write_creds(path: Path, user_jwt: str, user: Key) -> Path:
    return write_secret(path, _CREDS.format(jwt=user_jwt, seed=user.seed))
