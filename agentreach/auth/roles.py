"""Who may do what: one permission template per role, in NATS subject terms.

A user issued by a role's scoped signing key gets exactly that role's template, with
``{{name()}}`` replaced by the user's name — an agent's name is its ``agent_id``, a caller's
its caller name. Anything not allowed is denied, and the server logs each violation.

What makes the names stick: everything a party publishes names the sender in its subject's
last token (events, replies, intake, registration), and the template allows that token to be
the party's own name only. Templates inside a token (``agent-{{name()}}-p1``,
``_INBOX_{{name()}}``) need nats-server 2.11 or later; an older server takes them literally,
which fails closed (the agent is refused, nobody gains anything).
"""

from __future__ import annotations

import re
from typing import Any, Final

from agentreach.broker import Names, Topology
from agentreach.broker.names import PROBE_INBOX, probe_replies
from agentreach.envelopes import MAX_TTL_MS, PRIORITIES

NAME: Final = "{{name()}}"
ROLES: Final = ("agent", "caller", "worker", "coordinator", "operator")
# Events an agent may publish about its tasks, and a worker about dead letters.
AGENT_EVENTS: Final = (
    "accepted",
    "progress",
    "completed",
    "failed",
    "expired",
    "late_result_rejected",
    "clock_drift",
)
WORKER_EVENTS: Final = ("replayed", "resolved")
# A responder may answer each request it received once, within 10 s (probes, discovery);
# the coordinator within a task's longest ttl (a `reach.call` is answered with its result).
_ONE_RESPONSE: Final = {"max": 1, "ttl": 10_000_000_000}
_ONE_RESULT: Final = {"max": 1, "ttl": (MAX_TTL_MS + 60_000) * 1_000_000}
# Which streams exist, or capture a subject: asked while a write finds no stream leader (an
# election), and to bind a bucket or wait for provisioning.
_STREAM_NAMES: Final = "$JS.API.STREAM.NAMES"
_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_RESERVED: Final = ("coordinator", "compensation")

Permissions = dict[str, Any]


def permissions(role: str, names: Names) -> Permissions:
    """The template of ``role`` for the subjects of ``names``."""
    templates = {
        "agent": agent,
        "caller": caller,
        "worker": worker,
        "coordinator": coordinator,
        "operator": operator,
    }
    if role not in templates:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return templates[role](names)


def expanded(role: str, name: str, names: Names) -> Permissions:
    """What the user ``name`` of ``role`` may do, ``{{name()}}`` filled in."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(NAME, name)
        if isinstance(value, list):
            return [fill(item) for item in value]
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    return fill(permissions(role, names))


def check_name(name: str, role: str) -> str:
    """A name fills subject tokens: letters, digits, ``_`` and ``-``, and no system name."""
    if not _NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{role} name {name!r}: use letters, digits, '_' and '-', starting with a letter"
            " or digit (it becomes a subject token)"
        )
    if role in ("agent", "caller", "worker") and name.lower().startswith(_RESERVED):
        raise ValueError(f"{role} name {name!r} is reserved for the system")
    if f"_INBOX_{name}" == PROBE_INBOX:  # its inbox would hold everyone's probe answers
        raise ValueError(f"{role} name {name!r} is reserved for the system")
    return name


def agent(names: Names) -> Permissions:
    """Its own dispatch consumers, card, heartbeat and execution records; events, replies,
    sub-tasks and registration as itself; answers to probes, in ``_INBOX_probe`` only."""
    n, me = names, NAME
    publish: list[str] = []
    for priority in PRIORITIES:
        publish += _pull_consumer(
            n.dispatch_stream(priority),
            n.agent_consumer(me, priority),
            filter_subject=n.dispatch(me, priority),
        )
    # Which streams exist (it waits for the coordinator to provision them); not their info,
    # which lists every subject a stream holds (topics, message ids, callers, agents).
    publish.append(_STREAM_NAMES)
    publish += _own_key(n.agents_bucket, me, read=True)  # its card, read for the next epoch
    # Its heartbeat, read when a conditional write is refused: a newer epoch fences it out.
    publish += _own_key(n.heartbeats_bucket, me, read=True)
    # Execution records are keyed <caller>.<message_id>.<agent_id>: the agent's own name is
    # the last token, so a wildcard in a read still only reaches its own records.
    publish += _own_key(n.executions_bucket, f"*.*.{me}", read=True)
    publish += [n.event(kind, "*", "*", "*", me) for kind in AGENT_EVENTS]
    publish += [
        f"{n.prefix}.reply.*.*.{me}",  # a result to a caller's box, in its own name
        f"{n.workflow_reply('*')}.{me}",  # a result to a workflow step
        n.task("*", me),  # sub-tasks, as a caller
        n.call("*", me),
        n.trace_request(me),  # how its own sub-tasks went (ctx.invoke of one sent before)
        n.status,  # whether a coordinator runs (an unacknowledged sub-task says so)
        n.register(me),
        n.presence(me),  # "does another process serve my id already?"
        f"{PROBE_INBOX}.>",  # answers to probes: presence, ping, discovery
    ]
    subscribe = [
        _inbox(),
        f"{probe_replies(me)}.>",  # the answers to its own presence check
        n.presence(me),
        n.ping(me),
        n.agent_control(me),
        n.reply_box(me, ">"),  # replies to its own sub-tasks
        # NATS micro discovery (``nats micro ls``) of the presence service: its ids are
        # random, so any id; Agent-Reach never trusts a discovery answer.
        *(f"$SRV.{verb}" for verb in ("PING", "INFO", "STATS")),
        "$SRV.*.reach-agent",
        "$SRV.*.reach-agent.*",
    ]
    # No response permission: with one, an agent could send itself a message (on its own
    # presence subject, or its own reply box, which it may both publish and subscribe to)
    # whose reply subject it chose, and then publish there: anywhere in the account.
    return _permissions(publish, subscribe)


def caller(names: Names) -> Permissions:
    """Intake as itself, replies in its own box space, the traces of its own messages,
    cancels and signals of workflows as itself (the coordinator acts only on those it
    started), and whether a coordinator runs (``reach publish --wait`` asks first); nothing
    else."""
    publish = [
        names.task("*", NAME),
        names.call("*", NAME),
        names.trace_request(NAME),
        f"{names.workflow_cancel('*')}.{NAME}",
        f"{names.workflow_signal('*', '*')}.{NAME}",
    ]
    return _permissions(
        [*publish, names.status, _STREAM_NAMES], [_inbox(), names.reply_box(NAME, ">")]
    )


def worker(names: Names) -> Permissions:
    """A compensation worker: reads and settles the dead letters through its own consumer,
    replays as itself and records ``replayed``/``resolved`` as itself; deletes nothing."""
    n, consumer = names, f"compensation-{NAME}"
    publish = _pull_consumer(n.dlq_stream, consumer, filter_subject=None)
    # nats-py names a single filter in the create subject; any filter of the DLQ is fine.
    publish.append(f"$JS.API.CONSUMER.CREATE.{n.dlq_stream}.{consumer}.>")
    publish.append(_STREAM_NAMES)
    publish += [n.task("*", NAME), n.status]  # a replay warns when no coordinator runs
    publish += [n.event(kind, "*", "*", "*", NAME) for kind in WORKER_EVENTS]
    publish += [n.settled(kind, "*", "*", "*", NAME) for kind in WORKER_EVENTS]
    # Whether a letter is settled already: the last replayed/resolved event about it, alone
    # (kept as long as the letter, and in the trace for those settled before that was so).
    publish += [
        f"$JS.API.DIRECT.GET.{stream}.{of_kind(kind)}"
        for stream, of_kind in (
            (n.settled_stream, n.settled_of_kind),
            (n.events_stream, n.events_of_kind),
        )
        for kind in WORKER_EVENTS
    ]
    return _permissions(publish, [_inbox(), n.reply_box(NAME, ">")])


def coordinator(names: Names) -> Permissions:
    """The service identity: all of the prefix, the JetStream API, the buckets and the
    payload store, but it deletes no stream and no dead letter (those are the operators').
    No other party may use the payload store (see :mod:`agentreach.broker.claim_check`)."""
    p, kept = names.prefix, names.history_streams
    topology = Topology.default(names)
    ours = [s.name for s in topology.streams] + [f"KV_{b.name}" for b in topology.buckets]
    ours += [o.stream for o in topology.objects]
    # The payload store: objects are written to `$O.<bucket>.>`, and a read of a chunked
    # one is an ordered consumer, whose flow control is answered on `$JS.FC.>`.
    objects = [f"$O.{o.name}.>" for o in topology.objects]
    return _permissions(
        [f"{p}.>", "$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", *objects],
        [_inbox(), f"{probe_replies(NAME)}.>", f"{p}.>"],  # its probes' answers too
        deny_publish=[
            # (named, not STREAM.DELETE.>: `replicas: auto` deletes a probe stream it made)
            *(f"$JS.API.STREAM.DELETE.{name}" for name in ours),
            *(f"$JS.API.STREAM.PURGE.{name}" for name in kept),
            # Smaller limits would drop what they hold: `reach provision` updates them.
            *(f"$JS.API.STREAM.UPDATE.{name}" for name in kept),
            *(f"$JS.API.STREAM.MSG.DELETE.{name}" for name in kept),
            f"$JS.API.CONSUMER.DELETE.{names.dlq_stream}.>",
        ],
        respond=True,
        response=_ONE_RESULT,
    )


def operator(names: Names) -> Permissions:
    """People operating the system: everything in the account (``nats``, ``reach dlq``…)."""
    return _permissions([">"], [">"])


def _permissions(
    publish: list[str],
    subscribe: list[str],
    *,
    deny_publish: list[str] | None = None,
    respond: bool = False,
    response: dict[str, int] = _ONE_RESPONSE,
) -> Permissions:
    result: Permissions = {
        "pub": {"allow": sorted(set(publish))},
        "sub": {"allow": sorted(set(subscribe))},
    }
    if deny_publish:
        result["pub"]["deny"] = sorted(deny_publish)
    if respond:
        result["resp"] = response
    return result


def _inbox() -> str:
    """Replies, JetStream API answers and pull deliveries: nobody else may read them."""
    return f"_INBOX_{NAME}.>"


def _pull_consumer(stream: str, consumer: str, *, filter_subject: str | None) -> list[str]:
    """Binding, pulling and acking one durable pull consumer. With ``filter_subject`` only
    the filtered create form is allowed, and the server refuses a body whose filter differs
    from the subject's: the user cannot widen it."""
    create = f"$JS.API.CONSUMER.CREATE.{stream}.{consumer}"
    return [
        f"{create}.{filter_subject}" if filter_subject else create,
        f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
    ]


def _own_key(bucket: str, key: str, *, read: bool) -> list[str]:
    """Writing (and reading) keys that end in the user's own name."""
    subjects = [f"$KV.{bucket}.{key}"]
    if read:  # only the subject-suffixed direct get: the bare form takes any subject
        subjects.append(f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}")
    return subjects
