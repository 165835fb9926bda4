"""Which ``Host`` a request to the dashboard may name: its defence against DNS rebinding.

A page of any site can make its own name resolve to 127.0.0.1 after it loaded (DNS
rebinding). The browser then sends that page's requests to the dashboard as same-origin
ones, with ``Host`` and ``Origin`` both naming the other site, so comparing the two proves
nothing, and custom headers need no preflight. What such a request cannot do is name this
server: so every request, on every route, must name a loopback name or the address it came
in on, with the port it came in on, or a name the operator allowed (``--allow-host``). A
``Host`` without a port is taken for any of these names: browsers leave out a default port (a
proxy on 80 or 443 in front), and some clients any port; the name is what rebinding cannot fake.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agentreach.coordinator.observability.http import Request

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?|\[[0-9a-f:.]+\]")
_PORT = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True)
class _Allowed:
    name: str
    port: int | None  # None: any port (a name the operator gave, say behind a proxy)


class AllowedHosts:
    """The ``Host`` values the dashboard answers: loopback names and the address a request
    came in on, with the port it came in on; and ``extra`` names (``NAME``: on any port;
    ``NAME:PORT``: on that one); any of those names without a port. A malformed extra name
    raises :class:`ValueError`."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.extra: tuple[_Allowed, ...] = tuple(_allowed(given) for given in extra)

    def answers(self, request: Request) -> bool:
        """Whether the ``Host`` of ``request`` names this dashboard."""
        host = split_host(request.headers.get("host", ""))
        if host is None:
            return False
        name, port = host
        allowed = [(a.name, a.port) for a in self.extra] + self._local(request)
        # A port of None on either side: any port (an extra NAME, a Host without one).
        return any(n == name and (None in (p, port) or p == port) for n, p in allowed)

    def refusal(self, request: Request) -> str | None:
        """Why ``request`` is not for this dashboard; None when it is."""
        if self.answers(request):
            return None
        names = [f"{name}:{port}" for name, port in self._local(request)]
        names += [a.name if a.port is None else f"{a.name}:{a.port}" for a in self.extra]
        return (
            f"this dashboard does not answer to Host {request.headers.get('host', '')!r}"
            f" (a page of another site may reach it under its own name), only to"
            f" {', '.join(names)}; start it with --allow-host NAME to add a name"
        )

    @staticmethod
    def _local(request: Request) -> list[tuple[str, int]]:
        if request.local is None:
            return []
        address, port = request.local
        return [(name, port) for name in dict.fromkeys((*LOOPBACK, _address(address)))]


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` → (its name in lower case, its port or None), or None when malformed."""
    value = value.strip().lower()
    if value.startswith("["):  # an IPv6 address: [::1]:8765
        end = value.find("]") + 1
        name, rest = value[:end], value[end:]
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if not _NAME.fullmatch(name):
        return None
    if not rest:
        return name, None
    port = rest.removeprefix(":")
    if not rest.startswith(":") or not _PORT.fullmatch(port) or int(port) > 65535:
        return None
    return name, int(port)


def _allowed(given: str) -> _Allowed:
    text = given.strip()
    with contextlib.suppress(ValueError):  # an IPv6 address given bare: as a Host names it
        text = f"[{ipaddress.IPv6Address(text)}]"
    host = split_host(text)
    if host is None:
        raise ValueError(f"--allow-host {given!r} is not a host name, an address or NAME:PORT")
    return _Allowed(*host)


def _address(address: str) -> str:
    """A local socket address as a ``Host`` names it: IPv6 in brackets, and an IPv4 client of
    a dual-stack socket (``::ffff:10.0.0.5``) by its IPv4 address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address.lower()
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ip.ipv4_mapped) if ip.ipv4_mapped else f"[{ip}]"
    return str(ip)
