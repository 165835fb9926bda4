"""Who may use the dashboard: whoever holds its access token (as Jupyter does it).

The dashboard reads and replays with an operator's NATS credentials. Its ``Host`` check
(:mod:`.hosts`) and the replay's header and ``Origin`` checks stop other web pages in a
browser, not other processes on the same host: without a token, any local user or process,
with no NATS credentials at all, could read every dead letter's payload and have a task run
as an operator's replay. So every route but ``/healthz`` and ``/readyz`` (probes, which show
nothing) asks for the token. The page's first load with ``?token=`` trades it for a cookie
(HttpOnly: the page's scripts never see it; SameSite=Strict: no other site's request carries
it) and is sent on to the same URL without the token, out of the address bar and the history;
API clients send ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import re
from urllib.parse import urlencode

from agentreach.coordinator.observability.http import Request, Response

OPEN = frozenset({"/healthz", "/readyz"})  # probes: they show nothing and must need nothing
PAGE = frozenset({"/", "/index.html"})  # where ?token= is traded for the cookie
MIN_LENGTH = 16
# token68 (RFC 7235): what an Authorization header and a cookie both carry as they are.
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]+")
_HOW = (
    "open the URL `reach dashboard` printed at start (http://…/?token=…), or send the header"
    " `Authorization: Bearer <token>`; a dashboard started with --access-token-file PATH"
    " (or REACH_DASHBOARD_TOKEN) has its token there"
)


def valid_token(text: str, source: str) -> str:
    """``text`` without surrounding whitespace, once it is fit to be a token; ValueError
    naming ``source`` (where it came from) when it is too short to be unguessable or holds
    a character a header or a cookie cannot carry as it is."""
    token = text.strip()
    if len(token) < MIN_LENGTH or not _TOKEN.fullmatch(token):
        raise ValueError(
            f"{source}: a token must be one line of at least {MIN_LENGTH} characters of"
            " A-Z a-z 0-9 . _ ~ + / = - (`python3 -c 'import secrets;"
            " print(secrets.token_urlsafe())'` makes one)"
        )
    return token


class Access:
    """The token the dashboard asks of every request but :data:`OPEN`; ``None``: it asks
    none (``reach dashboard --no-token``)."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self._secret = token.encode() if token is not None else b""

    def refusal(self, request: Request) -> Response | None:
        """None when ``request`` may go on; otherwise its answer: 401 without the token or
        with a wrong one, or, for the page loaded with the right ``?token=``, a redirect to
        the same URL without it that sets the cookie."""
        if self.token is None or request.path in OPEN:
            return None
        if request.path in PAGE and "token" in request.query:
            if self._holds(request.query["token"][-1]):
                return self._login(request)
            return _unauthorized(given=True)
        presented = _bearer(request) + _cookies(request, self.cookie_name(request))
        if any(self._holds(given) for given in presented):
            return None
        return _unauthorized(given=bool(presented))

    def _holds(self, given: str) -> bool:
        # compare_digest: the time taken says nothing of how much of a guess was right.
        return hmac.compare_digest(given.encode(), self._secret)

    def _login(self, request: Request) -> Response:
        rest = [(k, v) for k, values in request.query.items() if k != "token" for v in values]
        location = request.path + (f"?{urlencode(rest)}" if rest else "")
        cookie = f"{self.cookie_name(request)}={self.token}; Path=/; HttpOnly; SameSite=Strict"
        return Response(303, b"", headers={"Location": location, "Set-Cookie": cookie})

    @staticmethod
    def cookie_name(request: Request) -> str:
        """The cookie's name, with the port served on: browsers keep cookies per host, not
        per port, so two dashboards on one host must not overwrite each other's."""
        return f"reach_dashboard_{request.local[1] if request.local else 0}"


def _bearer(request: Request) -> list[str]:
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    return [given.strip()] if scheme.lower() == "bearer" and given.strip() else []


def _cookies(request: Request, name: str) -> list[str]:
    """Every value of the cookie ``name`` (a browser may send one name twice, for two paths)."""
    found = []
    for pair in request.headers.get("cookie", "").split(";"):
        key, equals, value = pair.strip().partition("=")
        if equals and key == name:
            found.append(value.strip().strip('"'))
    return found


def _unauthorized(*, given: bool) -> Response:
    why = (
        "the token given is not this dashboard's (a restart makes a new one unless given one)"
        if given
        else "this dashboard needs its access token"
    )
    response = Response.error(401, f"{why}: {_HOW}")
    response.headers["WWW-Authenticate"] = 'Bearer realm="reach dashboard"'
    return response
