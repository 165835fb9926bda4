"""Envelope v1 codec: round trips, path-bearing errors, and nothing but DecodeError."""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentreach import envelopes
from agentreach.envelopes import (
    MAX_TTL_MS,
    Ack,
    Budget,
    Capacity,
    DeadLetter,
    DecodeError,
    ErrorInfo,
    ErrorReply,
    Event,
    Progress,
    Result,
    Task,
)

tokens = st.from_regex(r"\A[A-Za-z0-9_-]{1,40}\Z")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ms = st.integers(1, MAX_TTL_MS)
about = {
    "v": st.just(1),
    "message_id": tokens,
    "trace_id": tokens,
    "topic": tokens,
    "from_agent": st.none() | tokens,
    "to_agent": st.none() | tokens,
    "attempt": st.integers(1, 50),
    "created_at": st.integers(0, 2**41),
}
tasks = st.builds(
    Task,
    **about,
    payload=json_values,
    ttl_ms=ms,
    reply_to=st.none() | st.from_regex(r"\A[A-Za-z0-9_]{1,10}(\.[A-Za-z0-9_]{1,10}){0,3}\Z"),
    priority=st.sampled_from(["P0", "P1", "P2"]),
    budget=st.builds(Budget, seek_ms=ms, ack_ms=ms, execute_ms=ms),
)
errors = st.builds(ErrorInfo, type=tokens, message=st.text(max_size=40), retryable=st.booleans())
events = st.builds(
    Event,
    **about,
    event=tokens,
    agent_id=st.none() | tokens,
    at_ms=st.integers(0, 2**41),
    detail=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
messages = st.one_of(
    tasks,
    st.builds(Ack, **about, capacity=st.none() | st.builds(Capacity, free_slots=st.integers(0, 9))),
    st.builds(Progress, **about, note=st.text(max_size=30)),
    st.builds(Result, **about, result=json_values),
    st.builds(ErrorReply, **about, error=errors),
    events,
    st.builds(
        DeadLetter,
        v=st.just(1),
        reason=tokens,
        message_id=tokens,
        trace_id=tokens,
        topic=tokens,
        attempts=st.integers(0, 9),
        envelope=st.none() | tasks,
        error=st.none() | errors,
        trace=st.lists(events, max_size=3),
    ),
)


@given(messages)
@settings(max_examples=300)
def test_every_kind_round_trips(message):
    """encode → decode gives back an equal envelope of the same kind."""
    assert envelopes.decode(envelopes.encode(message)) == message


@given(st.binary(max_size=200))
@settings(max_examples=500)
def test_arbitrary_bytes_raise_only_decode_error(data):
    """Any bytes either decode or raise the project's DecodeError, naming a path."""
    try:
        envelopes.decode(data)
    except DecodeError as exc:
        assert exc.path.startswith("$")
        assert f"- at `{exc.path}`" in str(exc)


@given(
    st.dictionaries(
        st.sampled_from(
            ["v", "kind", "message_id", "topic", "ttl_ms", "priority", "budget", "attempt"]
        ),
        json_values,
    )
)
def test_arbitrary_objects_raise_only_decode_error(document):
    """Any JSON object either decodes or raises DecodeError."""
    with contextlib.suppress(DecodeError):
        envelopes.decode_task(json.dumps(document).encode())


def task_json(**overrides: object) -> bytes:
    fields = {"v": 1, "kind": "task", "message_id": "m1", "trace_id": "t1", "topic": "echo"}
    fields.update(overrides)
    return json.dumps({k: v for k, v in fields.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("document", "path", "text"),
    [
        (task_json(ttl_ms="5"), "$.ttl_ms", "Expected `int`, got `str`"),
        (task_json(ttl_ms=0), "$.ttl_ms", "Expected `int` >= 1"),
        (task_json(v=2), "$.v", "envelope version 2 is not spoken here: this is protocol v1,"),
        (task_json(priority="P9"), "$.priority", "Invalid enum value 'P9'"),
        (task_json(message_id=...), "$", "missing required field `message_id`"),
        (task_json(message_id="has.dot"), "$.message_id", "regex"),
        (task_json(budget={"ack_ms": "x"}), "$.budget.ack_ms", "Expected `int`"),
        (task_json(kind="result"), "$.kind", "Invalid value 'result'"),
        (b'{"v": 1, "kind"', "$", "JSON is malformed: truncated (the body ends before"),
        (b"  ", "$", "JSON is malformed: empty (the body holds no value)"),
        # "JSON is malformed: invalid character (byte 0)" said nothing of the encoding.
        (b"\xff\xfe", "$", "the body is not UTF-8 text (JSON must be): byte 0 is 0xff"),
    ],
)
def test_decode_errors_name_the_field(document, path, text):
    """A wrong field is reported with its JSON path and what was expected."""
    with pytest.raises(DecodeError) as caught:
        envelopes.decode_task(document)
    assert caught.value.path == path
    assert text in str(caught.value)


def test_unknown_fields_are_ignored():
    """A newer sender's extra fields do not break an older reader."""
    task = envelopes.decode_task(task_json(added_in_v1_5={"x": 1}))
    assert task.message_id == "m1"


def test_defaults_follow_the_design():
    """ttl 30 s, priority P1, attempt 1, ACK within 2 s."""
    task = envelopes.decode_task(task_json())
    assert (task.ttl_ms, task.priority, task.attempt, task.budget.ack_ms) == (
        30_000,
        "P1",
        1,
        2_000,
    )


def test_new_ids_are_time_ordered_uuid7():
    """message ids sort by creation time and carry version 7."""
    ids = [envelopes.new_id() for _ in range(50)]
    assert all(i[14] == "7" for i in ids)
    assert len(set(ids)) == 50
    assert envelopes.stable_id(10**18, "S", 1) == envelopes.stable_id(10**18, "S", 1)
    assert envelopes.stable_id(10**18, "S", 1) != envelopes.stable_id(10**18, "S", 2)


def test_the_time_of_an_id_is_read_back_from_uuid7_only():
    """``unix_ms_of`` gives the milliseconds a UUIDv7 carries, 0 for any other id."""
    assert envelopes.unix_ms_of(envelopes.stable_id(1_700_000_000_123_456_789, "S", 1)) == (
        1_700_000_000_123
    )
    assert envelopes.unix_ms_of("victim-1") == 0
    assert envelopes.unix_ms_of("00000000-0000-4000-8000-000000000000") == 0  # a UUIDv4


def test_schema_covers_every_kind_and_requires_core_fields():
    """The JSON Schema names each kind's tag and the required fields of a task; a task's
    ``kind`` defaults to ``task``, as the decoder takes a body without it."""
    schema = envelopes.json_schema()
    task = schema["$defs"]["Task"]
    assert task["properties"]["kind"] == {"enum": ["task"], "default": "task"}
    assert {"v", "message_id", "trace_id", "topic"} <= set(task["required"])
    assert "kind" not in task["required"]
    kindless = envelopes.decode_task(b'{"v": 1, "message_id": "m", "trace_id": "t", "topic": "x"}')
    assert envelopes.decode_as(envelopes.encode(kindless), dict)["kind"] == "task"


def test_a_number_out_of_range_is_named_by_its_path():
    """msgspec names only the container of ``1e400``; the error names the field."""
    with pytest.raises(DecodeError) as caught:
        envelopes.decode_task(
            b'{"v": 1, "kind": "task", "message_id": "m", "trace_id": "t",'
            b' "topic": "x", "payload": {"a": [1, 1e400]}}'
        )
    assert caught.value.path == "$.payload.a[1]"


def test_a_replay_id_follows_the_protocols_recipe():
    """The replay id of a letter is the UUIDv7 of protocol §15.2, pinned by a vector any
    language's worker can check itself against; each of its parts changes it."""
    letter_id = "01900000-0000-7000-8000-000000000001"
    made = envelopes.replay_id(1_764_720_000_000, "alice", letter_id, 0)
    assert made == "019ae182-3c00-78e4-94a4-0f85a22f0238"
    text = "\x00".join(["reach-replay", "alice", letter_id, "0"])
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    bits = int.from_bytes(digest[:10])
    value = uuid.UUID(made).int
    assert value >> 80 == 1_764_720_000_000 and uuid.UUID(made).version == 7
    assert (value >> 64) & 0xFFF == bits >> 68  # rand_a: the top 12 of the 80 bits
    assert value & ((1 << 62) - 1) == bits & ((1 << 62) - 1)  # rand_b: the low 62
    others = {
        envelopes.replay_id(1_764_720_000_001, "alice", letter_id, 0),
        envelopes.replay_id(1_764_720_000_000, None, letter_id, 0),
        envelopes.replay_id(1_764_720_000_000, "alice", letter_id + "2", 0),
        envelopes.replay_id(1_764_720_000_000, "alice", letter_id, 1),
    }
    assert made not in others and len(others) == 4
    # Sent to another topic than the task's: the topic is a fifth part.
    elsewhere = envelopes.replay_id(1_764_720_000_000, "alice", letter_id, 0, to_topic="review")
    assert elsewhere == "019ae182-3c00-7951-8f7b-f2655ab13b61"
    # Sent with another payload: `payload:` and its SHA-256 are a part after those.
    fixed = envelopes.summarize({"order": 1234}).sha256
    assert fixed == hashlib.sha256(b'{"order":1234}').hexdigest()
    with_fix = envelopes.replay_id(1_764_720_000_000, "alice", letter_id, 0, payload_sha256=fixed)
    assert with_fix == "019ae182-3c00-7f85-8f98-555dea5f8b3c"
