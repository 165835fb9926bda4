"""What the envelope contract says about one intake message, independently of the decoder.

A :class:`Case` is what arrives on ``reach.task.<topic>``: the body, the headers as the
coordinator reads them, and the :class:`Verdict` of SPEC.md and issue 11 — a task, or an
error that names the JSON path or header at fault, or (where the contract leaves the
choice to the implementation) either. :func:`task_violations` lists what is wrong with a
task the decoder accepted; :func:`names_fault` tells whether an error names the fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from agentreach import envelopes
from agentreach.broker import Names
from agentreach.envelopes import PRIORITIES, Task, is_token, task_from_intake
from agentreach.envelopes import headers as h

TOPIC = "fuzz"  # the topic the fuzz agent serves
NAMES = Names()
PREFIX = NAMES.prefix
# The envelope package's bound; a day where it names none: past that a task would outlive
# its execution record (reach_executions keeps one a day) and could run twice.
MAX_TTL_MS: int = getattr(envelopes, "MAX_TTL_MS", 86_400_000)
SURE_TTL_MS = 3_600_000  # a ttl up to an hour is valid whatever the upper bound is
RECEIVED_MS = 1_700_000_000_000
FALLBACK_ID = "fallback-0001"
ANY_JSON_PATH = "$*"  # a fault of the whole document: any path starting with `$` names it

# To the last backtick: msgspec quotes a key as it is, and a fuzzed key may hold a backtick.
_PATH = re.compile(r" - at `(?P<path>.*)`$", re.DOTALL)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_ASCII_SPACE = set(" \t\r\n\f\v")
Kind = Literal["ok", "bad", "either"]


@dataclass(frozen=True)
class Verdict:
    """``ok``: a task; ``bad``: an error naming one of ``paths``; ``either``: one or the other."""

    kind: Kind
    paths: frozenset[str] = frozenset()
    why: str = ""

    def softened(self) -> Verdict:
        """The same fault where the implementation may also ignore it."""
        return Verdict("either", self.paths, self.why) if self.kind == "bad" else self


OK = Verdict("ok")


def bad(path: str, why: str) -> Verdict:
    return Verdict("bad", frozenset({path}), why)


def either(path: str, why: str) -> Verdict:
    return Verdict("either", frozenset({path}), why)


def combine(*verdicts: Verdict) -> Verdict:
    """One input with several parts: any bad part makes it bad, and any faulty part's path
    may be the one named (which is checked first is the implementation's choice)."""
    faulty = [v for v in verdicts if v.kind != "ok"]
    if not faulty:
        return OK
    kind: Kind = "bad" if any(v.kind == "bad" for v in faulty) else "either"
    paths = frozenset().union(*(v.paths for v in faulty))
    return Verdict(kind, paths, "; ".join(v.why for v in faulty if v.why))


@dataclass(frozen=True)
class Case:
    """One message for ``reach.task.<topic>`` and what the contract says of it."""

    body: bytes
    headers: dict[str, str]
    topic: str
    verdict: Verdict
    note: str
    envelope: bool = False  # the body is a JSON object with both `v` and `kind`
    claimed_id: str | None = None  # the message_id the body claims, if it is a token
    body_verdict: Verdict | None = None  # on the subject and body alone, headers aside

    def __post_init__(self) -> None:
        # An object with `v` and `message_id` and no `kind` is an envelope that forgot it.
        if (kindless := kindless_verdict(self.body)).kind == "ok":
            return
        object.__setattr__(self, "verdict", combine(self.verdict, kindless))
        if self.body_verdict is not None:
            object.__setattr__(self, "body_verdict", combine(self.body_verdict, kindless))

    def show(self, limit: int = 160) -> str:
        """A short, copyable description: the body (cut), the headers and the subject."""
        body = self.body if len(self.body) <= limit else self.body[:limit]
        cut = "" if len(self.body) <= limit else f"…(+{len(self.body) - limit} bytes)"
        return (
            f"subject={NAMES.task(self.topic)!r} headers={self.headers!r} "
            f"body={body!r}{cut} [{self.note}; expected {self.verdict.kind}"
            f"{' at ' + ', '.join(sorted(self.verdict.paths)) if self.verdict.paths else ''}]"
        )

    def with_headers(self, headers: dict[str, str], note: str | None = None) -> Case:
        """The same body on the same subject with ``headers``, and its verdict."""
        assert self.body_verdict is not None, "a case made without a body verdict"
        read = header_verdict(headers)
        read = read.softened() if self.envelope else read  # an envelope's headers may be ignored
        return replace(
            self,
            headers=headers,
            verdict=combine(self.body_verdict, read),
            note=self.note if note is None else note,
        )

    def ids(self) -> set[str]:
        """Message ids this message can be known by (JetStream and dead letters dedupe them)."""
        known = {self.claimed_id} if self.claimed_id else set()
        if is_token(self.headers.get(h.MSG_ID)):
            known.add(self.headers[h.MSG_ID])
        return known


def decode_intake(case: Case) -> Task:
    """Decode ``case`` as the coordinator's intake does (its reply policy included)."""
    return task_from_intake(
        case.body,
        case.headers,
        topic=case.topic,
        received_ms=RECEIVED_MS,
        fallback_id=FALLBACK_ID,
        reply_allowed=NAMES.reply_allowed,
    )


# -- headers -----------------------------------------------------------------------------


def wire(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers as a subscriber reads them after NATS: names and values trimmed, CR/LF
    turned into spaces (nats-py does both when publishing and when parsing)."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = name.strip()
        if key:
            out[key] = value.strip().replace("\r", " ").replace("\n", " ").strip()
    return out


def header_verdict(headers: Mapping[str, str]) -> Verdict:
    """The verdict on the five headers intake reads for a bare body."""
    return combine(
        _id_header(headers, h.MSG_ID),
        _id_header(headers, h.TRACE_ID),
        _priority_header(headers.get(h.PRIORITY)),
        _ttl_header(headers.get(h.TTL)),
        reply_verdict(headers.get(h.REPLY_TO) or "", f"header {h.REPLY_TO}"),
    )


def _id_header(headers: Mapping[str, str], name: str) -> Verdict:
    value = headers.get(name)
    if not value or is_token(value):
        return OK
    return bad(f"header {name}", f"{name} {value[:40]!r} is not a token")


def _priority_header(value: str | None) -> Verdict:
    if not value or value.upper() in PRIORITIES:
        return OK
    if value.strip().upper() in PRIORITIES:
        return either(f"header {h.PRIORITY}", "priority padded with spaces")
    return bad(f"header {h.PRIORITY}", f"priority {value[:40]!r}")


def _ttl_header(value: str | None) -> Verdict:
    where = f"header {h.TTL}"
    if not value:
        return OK
    if not _DIGITS.fullmatch(value):
        return bad(where, f"ttl {value[:40]!r} is not a whole number of ms")
    ttl = int(value) if len(value) < 400 else MAX_TTL_MS + 1
    if not 0 < ttl <= MAX_TTL_MS:
        return bad(where, f"ttl {value[:40]} out of range")
    if ttl > SURE_TTL_MS or len(value) > 12:
        return either(where, f"ttl {value[:40]} is long")
    return OK


def reply_verdict(value: str, where: str) -> Verdict:
    """Where replies may go: one literal subject outside Agent-Reach's own and the system's
    (``$JS.API…`` would run JetStream API calls, ``$KV.reach_agents…`` write the registry)."""
    if not value:
        return OK
    tokens = value.split(".")
    if _ASCII_SPACE & set(value):
        return bad(where, f"reply subject {value[:40]!r} has white space")
    if "" in tokens or "*" in tokens or ">" in tokens:
        return bad(where, f"reply subject {value[:40]!r} is no literal subject")
    if value.startswith("$"):
        return bad(where, f"reply subject {value[:40]!r} is a system subject")
    if tokens[0] == PREFIX and len(tokens) > 1:
        if value.startswith(NAMES.workflow_reply("")):  # the coordinator's own step replies
            return either(where, "reply subject of a workflow")
        return bad(where, f"reply subject {value[:40]!r} is in the {PREFIX} namespace")
    if len(value) > 255 or not value.isascii() or not value.isprintable() or tokens[0] == PREFIX:
        return either(where, f"reply subject {value[:40]!r} is unusual")
    if "*" in value or ">" in value:
        return either(where, f"reply subject {value[:40]!r} holds a wildcard character")
    return OK


def kindless_verdict(body: bytes) -> Verdict:
    """An object with both `v` and `message_id` and no `kind` is refused: an envelope that
    forgot its kind (as a bare body its reply_to and ids went unread)."""
    try:
        document = envelopes.decode_json(body)
    except envelopes.DecodeError:
        return OK  # the body's own verdict says so
    if isinstance(document, dict) and {"v", "message_id"} <= document.keys():
        return OK if "kind" in document else bad("$.kind", "an envelope without its kind")
    return OK


def topic_verdict(topic: str) -> Verdict:
    return OK if is_token(topic) else bad("subject topic", f"subject topic {topic[:40]!r}")


# -- what an accepted task and a refusal must look like ----------------------------------


def task_violations(task: Task, case: Case) -> list[str]:
    """Every envelope invariant ``task`` breaks (empty when it is a sound task)."""
    problems: list[str] = []
    for name in ("message_id", "trace_id", "topic"):
        if not is_token(getattr(task, name)):
            problems.append(f"{name} {getattr(task, name)!r} is not a subject token")
    if task.topic != case.topic:
        problems.append(f"topic {task.topic!r} is not the subject's {case.topic!r}")
    if type(task.ttl_ms) is not int or not 0 < task.ttl_ms <= MAX_TTL_MS:
        problems.append(f"ttl_ms {task.ttl_ms!r} is not within 1..{MAX_TTL_MS}")
    if task.priority not in PRIORITIES:
        problems.append(f"priority {task.priority!r}")
    if task.reply_to is not None and reply_verdict(task.reply_to, "reply_to").kind == "bad":
        problems.append(f"reply_to {task.reply_to!r}: {reply_verdict(task.reply_to, '').why}")
    if task.v != 1 or task.attempt < 1:
        problems.append(f"v={task.v!r} attempt={task.attempt!r}")
    budget = task.budget
    if min(budget.seek_ms, budget.ack_ms, budget.execute_ms) <= 0:
        problems.append(f"budget {budget!r}")
    if not case.envelope:
        problems.extend(_wrapping_violations(task, case.headers))
    problems.extend(_round_trip_violations(task))
    return problems


def _wrapping_violations(task: Task, headers: Mapping[str, str]) -> list[str]:
    """A bare body takes its fields from the headers, when they are given."""
    problems = []
    msg_id, trace_id = headers.get(h.MSG_ID), headers.get(h.TRACE_ID)
    if msg_id and task.message_id != msg_id:
        problems.append(f"message_id {task.message_id!r} is not Nats-Msg-Id {msg_id!r}")
    if trace_id and task.trace_id != trace_id:
        problems.append(f"trace_id {task.trace_id!r} is not Reach-Trace-Id {trace_id!r}")
    ttl = headers.get(h.TTL)
    if ttl and _DIGITS.fullmatch(ttl) and task.ttl_ms != int(ttl):
        problems.append(f"ttl_ms {task.ttl_ms!r} is not Reach-TTL {ttl!r}")
    reply_to = headers.get(h.REPLY_TO) or None
    if task.reply_to != reply_to:
        problems.append(f"reply_to {task.reply_to!r} is not Reach-Reply-To {reply_to!r}")
    custom = {k: v for k, v in headers.items() if not k.startswith(("Nats-", "Reach-"))}
    if any(task.headers.get(k) != v for k, v in custom.items()):
        problems.append(f"custom headers {custom!r} not kept: {task.headers!r}")
    return problems


def _round_trip_violations(task: Task) -> list[str]:
    """An accepted task must survive the router's encode and the agent's decode."""
    try:
        again = envelopes.decode_task(envelopes.encode(task))
    except Exception as exc:
        return [f"does not survive encode/decode_task: {type(exc).__name__}: {exc}"[:300]]
    return [] if again == task else ["encode/decode_task gives another task"]


def path_of(message: str) -> str | None:
    """The path a refusal's message names (``… - at `$.ttl_ms```), if any."""
    match = _PATH.search(message)
    return match.group("path") if match else None


def is_path(path: str | None) -> bool:
    """Whether ``path`` is a JSON path, a header or the subject's topic."""
    return bool(path) and (
        path.startswith("$") or path.startswith("header ") or path == "subject topic"
    )


def names_fault(path: str, message: str, expected: frozenset[str]) -> bool:
    """Whether an error at ``path`` with ``message`` names one of the ``expected`` faults.

    ``$.a`` is named by ``$.a``, by a path inside it (``$.a.b``, ``$.a[...]``), or by
    ``$`` with a message that quotes ```a``` (msgspec's "missing required field `a`").
    """
    for want in expected:
        if want == ANY_JSON_PATH:
            if path.startswith("$"):
                return True
        elif path == want or path.startswith((want + ".", want + "[")):
            return True
        elif want.startswith("$."):
            parent, _, name = want.rpartition(".")
            if path == parent and f"`{name}`" in message:
                return True
    return False
