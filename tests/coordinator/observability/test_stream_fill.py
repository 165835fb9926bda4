"""How full the streams a `limits:` key bounds are: what the alert on a stream near its byte
limit reads, before a full intake refuses callers or a full dead-letter stream holds up
letters."""

from __future__ import annotations

import msgspec
import pytest

from agentreach.broker import Topology, provision
from agentreach.broker.limits import StorageLimits
from agentreach.coordinator.observability import state
from tests.coordinator.observability.test_metrics import WITH_METRICS, replica
from tests.scrape import scrape
from tests.support import until_true


@pytest.fixture(autouse=True)
def sample_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "SAMPLE_S", 0.1)


def of_stream(found: dict, name: str, stream: str) -> list[float]:
    return [v for (n, labels), v in found.items() if n == name and ("stream", stream) in labels]


async def test_each_limited_stream_says_what_it_holds_and_its_limit(broker):
    """REACH_TASKS with a byte limit: its bytes and its limit; REACH_EVENTS, unlimited: its
    bytes only (no limit to be near)."""
    names = broker.names
    limits = StorageLimits(tasks_bytes=65_536)
    await provision(broker, Topology.default(names, limits=limits))  # an operator's, for all
    async with replica(broker, msgspec.structs.replace(WITH_METRICS, limits=limits)) as replica_:

        async def sampled() -> dict | None:
            found = await scrape(replica_.metrics_url)
            return found if of_stream(found, "reach_stream_bytes", names.tasks_stream) else None

        found = await until_true(sampled)
    assert of_stream(found, "reach_stream_max_bytes", names.tasks_stream) == [65_536]
    assert len(of_stream(found, "reach_stream_bytes", names.events_stream)) == 1
    assert of_stream(found, "reach_stream_max_bytes", names.events_stream) == []
