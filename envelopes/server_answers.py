"""Messages the NATS server wrote, not a party: its answers to requests.

The server sends its answer to a request — a JetStream API response, a publish
acknowledgement, a pull's status — to the request's reply subject, whatever that subject is,
and nats-server checks a reply subject against no permission. So any party may have the
server write onto a subject it may not publish to itself (``reach.wf.cancel.<id>``, another
caller's ``reach.task.<topic>.<caller>``): the words are the server's, the subject is theirs.
What reads such a subject takes these for what they are, nobody's message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from agentreach.envelopes.errors import DecodeError

# What a JetStream publish acknowledgement holds (nats-server's JSPubAckResponse).
_PUB_ACK_KEYS = frozenset({"stream", "seq", "domain", "duplicate", "val", "batch", "count"})
_API_ERROR_KEYS = frozenset({"code", "description"})
# How nats-server's JSON answers open (Go's encoder: compact, fields in declaration order):
# an API response names its type first; a publish ack opens with its stream, or its error.
_SERVER_JSON = (b'{"type":"io.nats.', b'{"stream":', b'{"error":')


# Set by the Broker's client on a message read by a direct get whose stored headers held a
# stream's name already: the server's answer to someone's direct get, stored where they aimed
# it. The server puts its own headers after the stored ones, so only the reader sees this.
STORED_ANSWER = "Reach-Stored-Answer-Of"
# What nats-server adds to a stored message it answers a direct get with, in this order.
DIRECT_GET_ADDS = ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp")


class ServerAnswer(DecodeError):
    """A message that is the NATS server's answer to someone's request (see the module)."""


# A direct get that asks for no headers (`{"no_hdr": true}`) is answered with the stored
# body alone: content its requester wrote under a key of its own, sent to any subject, with
# nothing to tell it apart. Where every party's message carries headers (events but
# `progress`, replies, workflow messages, the coordinator's own tasks), none means that.
NO_HEADERS = (
    "a message with no headers, where every party's carries some: what the NATS server"
    " sends of a stored message when a direct get asks for none (no_hdr), to a reply subject"
    " its requester chose (nats-server checks reply subjects against no permission)"
)


# What the coordinator's control message to an agent carries (one without is nobody's).
CONTROL_HEADERS = {"Reach-Kind": "control"}


def refuse_headerless(headers: Mapping[str, str] | None, what: str) -> None:
    """Raise :class:`ServerAnswer` when ``headers`` are none (see :data:`NO_HEADERS`)."""
    if not headers:
        raise ServerAnswer(f"{what}: {NO_HEADERS}")


def server_answer(data: bytes, headers: Mapping[str, str] | None) -> str | None:
    """What ``data`` is when the NATS server wrote it ("a JetStream publish acknowledgement",
    …), None when a party did."""
    if headers and STORED_ANSWER in headers:
        return (
            f"a JetStream direct get's answer (a message of {headers[STORED_ANSWER]}, sent"
            " again by the server where someone aimed it)"
        )
    if headers and _copied(headers):
        # A stored message as a direct get answers with it: its content is whatever its
        # writer chose, who may write its own keys only (an agent's, say).
        return (
            f"a JetStream direct get's answer (message {headers.get('Nats-Sequence', '?')} of"
            f" {_stream_of(headers)}, sent again by the server)"
        )
    if headers and "Status" in headers and not data:
        said = f"{headers['Status']} {headers.get('Description', '')}".strip()
        return f"a NATS status message ({said})"
    if not data and not headers:  # what a stream keeps of a status: its headers are not kept
        return "an empty message without headers (as a stream keeps a NATS status message)"
    # On the intake's path for every task: parsed only when it opens as the server's do.
    if not data.startswith(_SERVER_JSON):
        return None
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):  # deep nesting: no answer of the server's
        return None
    if not isinstance(document, dict):
        return None
    kind = document.get("type")
    if isinstance(kind, str) and kind.startswith("io.nats."):
        return f"a NATS server's API response ({kind})"
    if "stream" in document and "seq" in document and document.keys() <= _PUB_ACK_KEYS:
        return "a JetStream publish acknowledgement"
    error = document.get("error")
    if isinstance(error, dict) and error.keys() >= _API_ERROR_KEYS and len(document) <= 3:
        return f"a JetStream error response ({error.get('description')})"
    return None


def copied_by_direct_get(headers: Mapping[str, str] | None) -> bool:
    """Whether ``headers`` are a direct get's answer's (a stored message sent again), where
    nothing else can be told: the server's own advisories look like its answers by design."""
    return headers is not None and (STORED_ANSWER in headers or _copied(headers))


def _copied(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` hold what a direct get's answer adds to a stored message. The
    server writes the first of them onto the stored block's last line, which a block that
    does not end as it should turns into ``…Nats-Stream`` or a value: the others stay."""
    return any(name in headers for name in DIRECT_GET_ADDS) or any(
        name.endswith("Nats-Stream") for name in headers
    )


def _stream_of(headers: Mapping[str, str]) -> str:
    return next((v for k, v in headers.items() if k.endswith("Nats-Stream")), "a stream")


def refuse_server_answers(
    data: bytes, headers: Mapping[str, str] | None, subject: str, *, headed: bool = False
) -> None:
    """Raise :class:`ServerAnswer` when the server wrote ``data``, naming what it is;
    ``headed``: where every party's message carries headers, one without (see NO_HEADERS)."""
    if said := server_answer(data, headers):
        raise ServerAnswer(
            f"not a message of anyone's: {said}, which the NATS server sends to the reply"
            f" subject of a request, and a request named {subject!r} as its reply subject"
            " (nats-server checks reply subjects against no permission)"
        )
    if headed and not headers:
        raise ServerAnswer(
            f"not a message of anyone's: {NO_HEADERS}. Sent by hand, give it a header:"
            " `nats pub -H 'Nats-Msg-Id: <its message_id>' …`"
        )
