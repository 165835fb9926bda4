"""Why a first connect failed, in words an operator can act on.

nats-py reports each failed attempt to the error callback, then raises only the last
failure (most often ``NoServersError``, which says nothing). :class:`FailedAttempts` keeps
what each server said, once: for a TLS failure the certificate problem and what to check,
for refused creds that have expired when they did and how to get new ones.
"""

from __future__ import annotations

import ssl
from datetime import UTC, datetime
from enum import Enum
from urllib.parse import ParseResult

import nats.errors

from agentreach.broker.auth import Auth, expiry_of, role_of, user_name_of
from agentreach.broker.client import Client, TlsNotOffered
from agentreach.broker.errors import AuthenticationFailed, ConnectError, TlsFailed
from agentreach.broker.urls import redacted

_HOSTNAME_MISMATCH = 62  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH


class _Kind(Enum):
    TLS = 1
    REFUSED = 2  # the server refused the credentials
    NOT_LISTENING = 3  # nothing accepts connections at the address
    OTHER = 4


class FailedAttempts:
    """The failures of one first connect, by server, each said once."""

    def __init__(self, client: Client, auth: Auth, *, servers: list[str]) -> None:
        self._client = client
        self._auth = auth
        self._several = len(servers) > 1
        self._said: list[str] = []
        self._kinds: set[_Kind] = set()

    def record(self, exc: BaseException) -> None:
        """One failed attempt, reported to the error callback while ``client`` connects."""
        trying = self._client.trying
        said = _explained(exc, trying, self._auth)
        if isinstance(exc, TimeoutError) and self._client.tcp_taken:
            wait_s = self._client.options.get("connect_timeout", 2)
            said = (
                f"the port took the connection but sent no NATS greeting within {wait_s:g} s"
                " (is it a NATS server's client port, and is that server well? one that wants"
                " TLS first needs --tls-first)"
            )
        if self._several and trying is not None:
            said = f"{redacted(trying.geturl())}: {said}"
        if said not in self._said:
            self._said.append(said)
        self._kinds.add(_kind_of(exc))

    def error(self, shown_url: str, last: BaseException) -> ConnectError:
        """The error to raise for the connect to ``shown_url`` that failed with ``last``."""
        if not self._said:
            self.record(last)
        message = f"cannot connect to NATS at {shown_url}: {'; '.join(self._said)}"
        if _Kind.REFUSED in self._kinds:
            return AuthenticationFailed(f"{message} ({_refused_hint(self._auth)})")
        if self._kinds == {_Kind.TLS}:
            return TlsFailed(message)
        if self._kinds == {_Kind.NOT_LISTENING}:
            message += (
                " (nothing listens there: is the NATS server running — `reach up` starts one —"
                " and is this its address? NATS_URL or --nats-url gives another)"
            )
        return ConnectError(message)

    def timed_out(self, shown_url: str, after_s: float) -> ConnectError:
        """The error for a first connect that did not end within ``after_s`` seconds."""
        said = "; ".join(self._said) or "no answer"
        return ConnectError(
            f"cannot connect to NATS at {shown_url}: gave up after {after_s:.0f} s ({said})"
        )


def refuses_credentials(exc: BaseException) -> bool:
    """An authorization error from the server (nats-py gives no one type for it)."""
    said = str(exc).lower()
    return isinstance(exc, nats.errors.AuthorizationError) or (
        "authorization violation" in said or "authentication" in said
    )


def _kind_of(exc: BaseException) -> _Kind:
    if isinstance(exc, ssl.SSLError | TlsNotOffered):
        return _Kind.TLS
    if isinstance(exc, ConnectionRefusedError):
        return _Kind.NOT_LISTENING
    return _Kind.REFUSED if refuses_credentials(exc) else _Kind.OTHER


def _explained(exc: BaseException, server: ParseResult | None, auth: Auth) -> str:
    if isinstance(exc, ssl.SSLError):
        return _tls_explained(exc, server, auth)
    return str(exc) or type(exc).__name__


def _tls_explained(exc: ssl.SSLError, server: ParseResult | None, auth: Auth) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        problem = f"the server's TLS certificate is not trusted: {exc.verify_message}"
        if exc.verify_code == _HOSTNAME_MISMATCH:
            check = "the certificate does not name this host: connect by a name it was issued for"
        elif auth.tls_ca is None:
            check = "pass --tls-ca or NATS_CA naming the CA that signed the server's certificate"
        else:
            check = f"--tls-ca {auth.tls_ca} is not the CA that signed the server's certificate"
    else:
        problem = f"the TLS handshake failed: {exc.reason or exc}"
        check = (
            "if the server asks for a client certificate, pass --tls-cert and --tls-key;"
            " if it wants TLS first, --tls-first"
        )
    if server is not None and server.scheme == "nats":
        check += "; the server requires TLS: use a tls:// URL"
    return f"{problem} ({check})"


def _refused_hint(auth: Auth) -> str:
    """What to check when the server refused the credentials: expired ones say when."""
    expired_at = expiry_of(auth.creds) if auth.creds is not None else None
    if auth.creds is None or expired_at is None or expired_at > datetime.now(UTC):
        return "check --creds / NATS_CREDS, or the server's users"
    role = role_of(auth.creds) or "agent|caller|worker|operator"
    name = user_name_of(auth.creds) or "NAME"
    return (
        f"the creds in {auth.creds} expired at {expired_at:%Y-%m-%d %H:%M:%S} UTC;"
        f" issue new ones: reach auth {role} {name}"
    )
