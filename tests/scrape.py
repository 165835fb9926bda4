"""Reading a coordinator's HTTP endpoint in tests: raw GETs and parsed Prometheus samples."""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client.parser import text_string_to_metric_families


async def http_get(url: str, *, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """``(status, body)`` of a GET on a loopback URL (``http://host:port/path``)."""
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n{extra}\r\n"
    try:
        writer.write(request.encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: ``(name, sorted labels) → value``."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def total(found: dict, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= set(ls))


async def scrape(url: str) -> dict:
    status, body = await http_get(url + "metrics")
    assert status == 200, body
    return samples(body)
