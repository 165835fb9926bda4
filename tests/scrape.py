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
    head = [f"Host: {hostport}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return await http_request(host, int(port), f"GET /{path}", head)


async def http_request(
    host: str, port: int, request_line: str, head: list[str], body: bytes = b""
) -> tuple[int, str]:
    """``(status, body)`` of one request with exactly the header lines ``head`` (plus its
    Content-Length when it has a body): a Host of its own choosing, or none, or two."""
    status, _, text = await http_exchange(host, port, request_line, head, body)
    return status, text


async def http_exchange(
    host: str, port: int, request_line: str, head: list[str], body: bytes = b""
) -> tuple[int, dict[str, str], str]:
    """:func:`http_request`, with the response's headers too (names in lower case)."""
    reader, writer = await asyncio.open_connection(host, port)
    length = [f"Content-Length: {len(body)}"] if body else []
    lines = [f"{request_line} HTTP/1.1", *head, *length, "", ""]
    try:
        writer.write("\r\n".join(lines).encode() + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    top, _, rest = raw.partition(b"\r\n\r\n")
    status, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
    return int(status.split()[1]), headers, rest.decode()


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
