"""Free ports for servers this process starts, below the ephemeral range."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_ports(host: str, count: int) -> list[int]:
    """Ports nobody listens on, below the ephemeral range: a server that is down for a
    restart must find its port free again. In that range a client reconnecting to it may
    be given the server's own port as its source and connect to itself (TCP simultaneous
    open), holding the port: a restart then failed "address already in use" (a trial)."""
    low = ephemeral_low()
    found: list[int] = []
    while len(found) < count:
        port = random.randrange(10_000, low)
        if port in found:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        found.append(port)
    return found


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default
