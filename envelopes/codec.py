"""JSON codec for envelope v1, with errors that name the JSON path."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from agentreach.envelopes.errors import DecodeError
from agentreach.envelopes.messages import DeadLetter, Event, Message, Reply, Task
from agentreach.envelopes.server_answers import ServerAnswer, refuse_headerless, server_answer

_encoder = msgspec.json.Encoder()
_message_decoder = msgspec.json.Decoder(Message)
_reply_decoder = msgspec.json.Decoder(Reply)
_task_decoder = msgspec.json.Decoder(Task)
_event_decoder = msgspec.json.Decoder(Event)
_dead_letter_decoder = msgspec.json.Decoder(DeadLetter)
_any_decoder = msgspec.json.Decoder()
T = TypeVar("T")


def encode(message: msgspec.Struct | Any) -> bytes:
    """Serialize an envelope (or any msgspec-encodable value) to JSON bytes."""
    return _encoder.encode(message)


def decode(data: bytes | str) -> Message:
    """Decode any envelope kind; raises :class:`DecodeError` naming the bad field."""
    return _decode(_message_decoder, data)


def decode_task(data: bytes | str) -> Task:
    """Decode an envelope that must be a task."""
    return _decode(_task_decoder, data)


def decode_reply(data: bytes | str) -> Reply:
    """Decode what an agent sends to ``reply_to``: ack, progress, result or error."""
    return _decode(_reply_decoder, data)


def decode_event(data: bytes | str) -> Event:
    """Decode a lifecycle event from ``REACH_EVENTS``."""
    return _decode(_event_decoder, data)


def decode_stored_event(data: bytes, headers: Mapping[str, str] | None) -> Event:
    """An event as a stream keeps it; raises :class:`ServerAnswer` when the NATS server wrote
    it (anyone may aim the answer to a request at an event subject: a direct get's answer
    carries content they chose), :class:`DecodeError` when it is no event."""
    if said := server_answer(data, headers):
        raise ServerAnswer(f"not an event: {said}")
    event = decode_event(data)
    if event.event != "progress":  # the one event a party sends without a Nats-Msg-Id
        refuse_headerless(headers, "not an event")
    return event


def decode_dead_letter(
    data: bytes | str, headers: Mapping[str, str] | None = None, *, stored: bool = False
) -> DeadLetter:
    """Decode an entry of ``REACH_DLQ``; ``stored`` (with its ``headers``): one read from
    the stream, where anyone may have had the NATS server write its answer to a request
    (a direct get's, of content they chose): :class:`ServerAnswer` then."""
    raw = data.encode() if isinstance(data, str) else data
    if stored and (said := server_answer(raw, headers)):
        raise ServerAnswer(f"not a dead letter: {said}")
    if stored:  # the coordinator's letters carry their Nats-Msg-Id
        refuse_headerless(headers, "not a dead letter")
    return _decode(_dead_letter_decoder, data)


def decode_json(data: bytes | str) -> Any:
    """Decode plain JSON, raising :class:`DecodeError` for malformed input."""
    return _decode(_any_decoder, data)


def decode_as(data: bytes | str, kind: type[T]) -> T:
    """Decode a record of ``kind`` (an agent card, a heartbeat, …) with a decoder made once."""
    return _decode(_decoder_for(kind), data)  # type: ignore[no-any-return]


@functools.cache
def _decoder_for(kind: type[Any]) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(kind)


class _Huge:
    """A number no decoder of ours takes (``1e400``, an integer of thousands of digits),
    marked where it stands."""


# What msgspec says of such numbers, naming only their container (or ``$[...]``).
_OUT_OF_RANGE = ("Number out of range", "Integer value out of range")
# What msgspec says of a body that ends too soon; every other syntax error it reports as
# "JSON is malformed: …", and a body cut short is one too.
_TRUNCATED = "Input data was truncated"
# What msgspec says of a version other than 1 (`v` is `Literal[1]` in every envelope).
_VERSION = re.compile(r"Invalid enum value (.+) - at `\$\.v`")
_UNKNOWN_VERSION = (
    'envelope version {} is not spoken here: this is protocol v1, whose envelopes carry "v": 1'
)


class _Pairs(list[tuple[str, Any]]):
    """An object's members in order, duplicates kept: a huge number under a key given twice
    is still found (a dict would keep only the last value)."""


def _out_of_range_at(data: bytes | str) -> str | None:
    """The JSON path of the first number out of range; msgspec names only its container."""
    try:
        document = json.loads(
            data, parse_float=_finite_or_huge, parse_int=_int_or_huge, object_pairs_hook=_Pairs
        )
    except (ValueError, RecursionError):
        return None
    return _path_to(document, "$")


def _int_or_huge(text: str) -> int | _Huge:
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4,300): msgspec refuses it too
        return _Huge()


def _finite_or_huge(text: str) -> float | _Huge:
    value = float(text)
    return _Huge() if math.isinf(value) else value


def _path_to(value: Any, path: str) -> str | None:
    if isinstance(value, _Huge):
        return path
    if isinstance(value, _Pairs):
        children: Any = value
    elif isinstance(value, list):
        children = enumerate(value)
    else:
        return None
    for key, child in children:
        step = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
        if (found := _path_to(child, step)) is not None:
            return found
    return None


def _truncated(data: bytes | str) -> str:
    """msgspec's "Input data was truncated" said as the JSON mistake it is. msgspec says so
    of a whole body holding a lone UTF-16 surrogate escape too (``"\\ud800"``): a red team
    read "truncated" of a body that was not."""
    if not data.strip():
        return "JSON is malformed: empty (the body holds no value)"
    try:
        json.loads(data)  # lenient about surrogates: it reads such a body whole
    except ValueError:
        return "JSON is malformed: truncated (the body ends before the value does)"
    return (
        "JSON is malformed: a lone surrogate escape (\\ud800-\\udfff without its pair)"
        " is no character"
    )


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes | str) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        message = str(exc)
        if message.startswith(_TRUNCATED):
            raise DecodeError(_truncated(data)) from None
        if message.startswith(_OUT_OF_RANGE) and (path := _out_of_range_at(data)):
            raise DecodeError(message.partition(" - at ")[0], path=path) from None
        if (version := _VERSION.fullmatch(message)) is not None:
            raise DecodeError(_UNKNOWN_VERSION.format(version[1]), path="$.v") from None
        if message.startswith("JSON is malformed") and (bad := _not_utf8(data)) is not None:
            raise DecodeError(bad, path="$") from None  # "invalid character (byte 0)" before
        raise DecodeError(message) from None
    except RecursionError:
        raise DecodeError("JSON is nested too deeply to decode", path="$") from None


def _not_utf8(data: bytes | str) -> str | None:
    """Where a body that is not UTF-8 text stops being so (JSON is text); None when it is."""
    if isinstance(data, str):
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start]
        return f"the body is not UTF-8 text (JSON must be): byte {exc.start} is 0x{bad:02x}"
    return None
