"""``reach dlq list | show ID | replay ID | resolve ID | stats``: the dead letters of
``REACH_DLQ``, each with its state (open, replayed, resolved, handled) as
:func:`agentreach.agents.letters.letter_state` says, as the dashboard shows it."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from collections.abc import Callable

from agentreach import envelopes
from agentreach.agents.errors import LetterSettled, ReplayLimitReached
from agentreach.agents.letters import (
    DEFAULT_MAX_REPLAYS,
    LETTERS_READ,
    SETTLING,
    UNCHANGED,
    letter_state,
    replay,
    resolve,
    settling_of,
    settling_of_letter,
)
from agentreach.broker import Broker, StreamNotFound, SubjectFull, read_stream
from agentreach.broker.streams import StoredMessage, subject_counts
from agentreach.cli.letter_views import (
    letter_key,
    listed,
    print_letter,
    print_letters,
    print_none_matching,
    print_stats,
)
from agentreach.cli.options import (
    Commands,
    MissingArgument,
    UsageError,
    a_topic,
    an_id,
    broker_of,
    names_of,
    operators_only,
)
from agentreach.cli.status import warn_without_coordinator
from agentreach.envelopes import MAX_TTL_MS, DeadLetter, Event
from agentreach.errors import ReachError


def register(commands: Commands) -> None:
    dlq = commands.add(
        "dlq",
        cmd_dlq,
        "dead letters: list | show ID | replay ID | resolve ID | stats",
        example=(
            "reach dlq list --open --reason expired",
            "reach dlq show 0190f3c2-…",
            "reach dlq replay 0190f3c2-… --to-topic manual_review",
            "reach dlq replay 0190f3c2-… --payload '{\"order\": 1234}'   # sent with a fix",
            "reach dlq replay 0190f3c2-… --force   # though replayed or resolved already",
            "reach dlq resolve 0190f3c2-… --note 'refunded by hand, ticket 4411'",
        ),
    )
    dlq.add_argument(
        "action",
        choices=["list", "show", "replay", "resolve", "stats"],
        help="list them, show one (JSON), replay one as a new task, record one as resolved"
        " (as a compensation worker does), or count them",
    )
    dlq.add_argument(
        "id", nargs="?", type=an_id, help="show, replay, resolve: the dead letter's message_id"
    )
    dlq.add_argument(
        "--at",
        type=int,
        default=None,
        metavar="AT_MS",
        help="show, replay, resolve: the id's letter dead-lettered at AT_MS (`dlq list --json`"
        " gives it), when the id has several; default the newest",
    )
    dlq.add_argument("--to-topic", default=None, type=a_topic, help="replay to another topic")
    dlq.add_argument(
        "--payload",
        default=None,
        metavar="JSON",
        help="replay with this payload instead of the task's own (a fix of what it was sent with)",
    )
    dlq.add_argument(
        "--ttl-ms",
        type=int,
        default=None,
        help="replay: how long the new task may live (default: the letter's task's ttl, at"
        " least 30000)",
    )
    dlq.add_argument("--note", default=None, help="resolve: how it was dealt with (required)")
    dlq.add_argument(
        "--max-replays",
        type=int,
        default=None,
        metavar="N",
        help="replay: refuse a letter whose task N replays led to already"
        f" (default {DEFAULT_MAX_REPLAYS})",
    )
    dlq.add_argument(
        "--force",
        action="store_true",
        help="replay: even a letter replayed or resolved already, or past --max-replays",
    )
    dlq.add_argument("--reason", default=None, help="only letters with this reason")
    dlq.add_argument("--topic", default=None, help="only letters of this topic")
    dlq.add_argument(
        "--json",
        action="store_true",
        help="list: one JSON object per letter and line (for scripts), not the table",
    )
    dlq.add_argument(
        "--open",
        action="store_true",
        help="list: only open letters (neither replayed, resolved nor handled by a workflow);"
        " resolve, with no id: every open letter of --reason and/or --topic",
    )


async def cmd_dlq(args: argparse.Namespace) -> int:
    _check(args)
    operators_only(args, "the dead-letter stream")
    names = names_of(args)
    async with broker_of(args) as broker:
        stored = await read_stream(
            broker,
            names.dlq_stream,
            names.dlq(args.reason or "*", args.topic or "*"),
            limit=LETTERS_READ,
        )
        if len(stored) >= LETTERS_READ:
            print(
                f"reach: only the oldest {LETTERS_READ:,} dead letters were read; narrow the"
                " search with --reason or --topic",
                file=sys.stderr,
            )
        letters = _readable(stored)
        filtered = args.reason or args.topic
        listing = args.action == "list" or (args.action == "resolve" and not args.id)
        there = await _there(broker) if not letters and filtered and listing else {}
        settled = await _settled(broker) if args.action in ("list", "resolve", "stats") else {}
        if args.action == "show":
            letter = _find(letters, args)
            print_letter(letter, await settling_of(broker, letter))
            return 0
        if args.action == "resolve" and not args.id:
            if not letters:  # a typo in --reason or --topic: say what there is
                print_none_matching(args.reason, args.topic, there)
                return 1
            return await _resolve_open(broker, letters, settled, args.note)
        if args.action == "resolve":
            return await _resolve(broker, _find(letters, args), settled, args.note)
        if args.action == "replay":
            task = await _replay(broker, _find(letters, args), args)
            await warn_without_coordinator(broker, "the replayed task waits in REACH_TASKS")
            print(json.dumps({"message_id": task.message_id, "trace_id": task.trace_id}))
            return 0
    if args.action == "stats":
        print_stats(letters, settled)
    elif not letters and (args.reason or args.topic):
        print_none_matching(args.reason, args.topic, there)
    else:
        # Keyed by the letter: a message id sent again past the duplicate window and
        # dead-lettered again has a letter per life, each with a state of its own.
        states = {letter_key(x): letter_state(settled.get(x.message_id), x) for x in letters}
        if args.open:
            letters = [letter for letter in letters if states[letter_key(letter)] == "open"]
        if args.json:
            for letter in letters:
                print(json.dumps(listed(letter, states[letter_key(letter)]), ensure_ascii=False))
        else:
            print_letters(letters, states, only_open=args.open)
    return 0


def _check(args: argparse.Namespace) -> None:
    """The options that fit the action: refused, not ignored."""
    many = args.action == "resolve" and args.open and not args.id
    if many and not (args.reason or args.topic):
        raise UsageError(
            "dlq resolve --open resolves every open letter of --reason and/or --topic: give"
            " one (--reason '*' for every reason)"
        )
    if args.action in ("show", "replay", "resolve") and not args.id and not many:
        raise MissingArgument(
            f"dlq {args.action} needs the message_id of a dead letter"
            + (" (or --open with --reason/--topic, for many)" if args.action == "resolve" else "")
        )
    if args.action in ("list", "stats") and args.id:
        raise UsageError(
            f"dlq {args.action} takes no message_id (got {args.id!r}): reach dlq show {args.id}"
        )
    if args.action == "resolve" and not (args.note or "").strip():
        raise MissingArgument(
            "dlq resolve needs --note saying how the letter was dealt with (it is recorded)"
        )
    if args.note is not None and args.action != "resolve":
        raise UsageError(f"--note is for dlq resolve, not dlq {args.action}")
    if args.open and args.action not in ("list", "resolve"):
        raise UsageError(f"--open is for dlq list and resolve, not dlq {args.action}")
    if args.json and args.action != "list":
        raise UsageError(f"--json is for dlq list, not dlq {args.action}")
    if args.force and args.action != "replay":
        raise UsageError(f"--force is for dlq replay, not dlq {args.action}")
    if args.payload is not None and args.action != "replay":
        raise UsageError(f"--payload is for dlq replay, not dlq {args.action}")
    if args.payload is not None:
        _payload(args.payload)  # before the letter is looked for: "no dead letter" said less
    if args.at is not None and args.action not in ("show", "replay", "resolve"):
        raise UsageError(f"--at is for dlq show, replay and resolve, not dlq {args.action}")
    replay_only = (
        (args.to_topic, "--to-topic"),
        (args.max_replays, "--max-replays"),
        (args.ttl_ms, "--ttl-ms"),
    )
    for given, name in replay_only:
        if given is not None and args.action != "replay":
            raise UsageError(f"{name} is for dlq replay, not dlq {args.action}")
    if args.ttl_ms is not None and not 0 < args.ttl_ms <= MAX_TTL_MS:
        raise UsageError(
            f"--ttl-ms takes a number of ms from 1 to {MAX_TTL_MS} (a day), got {args.ttl_ms}"
        )
    if args.max_replays is not None and args.max_replays < 0:
        raise UsageError(f"--max-replays {args.max_replays}: expected 0 or more")


def _among(args: argparse.Namespace) -> str:
    """What ``--reason`` / ``--topic`` narrowed the search to, when they did: they select by
    the letter's own reason and topic (a replay's new topic is ``--to-topic``)."""
    filters = (("--reason", args.reason), ("--topic", args.topic))
    given = [f"{name} {value}" for name, value in filters if value]
    if not given:
        return ""
    return (
        f" among the letters of {' and '.join(given)} (the letter's own; a replay to another"
        " topic is --to-topic)"
    )


def _payload(text: str) -> object:
    try:
        return envelopes.decode_json(text)
    except envelopes.DecodeError as exc:
        raise UsageError(f"--payload is not valid JSON: {exc}") from None


async def _replay(broker: Broker, letter: DeadLetter, args: argparse.Namespace) -> envelopes.Task:
    """Replay the letter, unless it was replayed or resolved already, or its task is the
    product of ``--max-replays`` replays; or say in one line why it was not replayed."""
    step = letter.workflow
    if step is not None and not step.compensation and not args.force:
        raise UsageError(
            f"{letter.message_id} is step {step.step!r} of workflow instance"
            f" {step.instance_id!r}: a replay runs the step alone, and its instance, which"
            f" has ended or gone on without it, takes no part (`reach workflows show"
            f" {step.instance_id}`); start the workflow again instead, or --force"
        )
    try:
        return await replay(
            broker,
            letter,
            topic=args.to_topic,
            ttl_ms=args.ttl_ms,
            payload=UNCHANGED if args.payload is None else _payload(args.payload),
            max_replays=DEFAULT_MAX_REPLAYS if args.max_replays is None else args.max_replays,
            force=args.force,
        )
    except LetterSettled as exc:
        raise UsageError(f"{exc}; --force replays it anyway") from exc
    except ReplayLimitReached as exc:
        raise UsageError(
            f"dead letter {exc.message_id} ({letter.reason}, topic {letter.topic}) not replayed:"
            f" its task has been replayed {exc.replays} times already (--max-replays"
            f" {exc.max_replays}); --force replays it anyway"
        ) from exc
    except SubjectFull as exc:
        subject = broker.names.task(args.to_topic or letter.topic)
        raise ReachError(
            f"{letter.message_id} was not replayed: the intake holds as many tasks on"
            f" {subject} as it keeps (limits.tasks_per_subject), none taken by a coordinator"
            f" yet ({exc}); replay it again once they are (`nats stream subjects"
            f" {broker.names.tasks_stream}` shows each subject's backlog)"
        ) from exc


async def _resolve_open(
    broker: Broker, letters: list[DeadLetter], settled: dict[str, list[Event]], note: str
) -> int:
    """Resolve every open letter of those read (the --reason/--topic ones), with one note: a
    pile of letters someone dealt with at once."""
    open_ = [x for x in letters if letter_state(settled.get(x.message_id), x) == "open"]
    by = broker.auth.identity or "operator"
    for letter in open_:
        await resolve(broker, letter, note.strip(), by=by)
    print(f"{len(open_)} open letter(s) resolved, by {by}: {note.strip()}")
    return 0


async def _resolve(
    broker: Broker, letter: DeadLetter, settled: dict[str, list[Event]], note: str
) -> int:
    """Record a ``resolved`` event as a worker's ``comp.resolve`` does, by this operator."""
    settling = settling_of_letter(settled.get(letter.message_id), letter)
    if (state := letter_state(settling)) == "resolved":
        last = settling[-1].detail
        raise UsageError(
            f"{letter.message_id} is resolved already (by {last.get('by')}:"
            f" {last.get('note')!r}); nothing recorded"
        )
    by = broker.auth.identity or "operator"
    await resolve(broker, letter, note.strip(), by=by)
    print(f"{letter.message_id}: resolved (was {state}), by {by}: {note.strip()}")
    return 0


async def _there(broker: Broker) -> dict[str, Counter[str]]:
    """How many dead letters there are of each reason and of each topic."""
    names = broker.names
    counts = await subject_counts(broker, names.dlq_stream, names.dlq("*", "*"))
    there: dict[str, Counter[str]] = {"reason": Counter(), "topic": Counter()}
    for subject, count in counts.items():
        reason, topic = subject.rsplit(".", 2)[1:]
        there["reason"][reason] += count
        there["topic"][topic] += count
    return there


async def _settled(broker: Broker) -> dict[str, list[Event]]:
    """The ``replayed`` and ``resolved`` events of each dead letter's message id, in the
    order they were stored: as ``REACH_SETTLED`` keeps them, else (a letter settled before
    it was there) as ``REACH_EVENTS`` does."""
    names = broker.names
    kept = await _settling_in(broker, names.settled_stream, names.settled_of_kind)
    traced = await _settling_in(broker, names.events_stream, names.events_of_kind)
    return {**traced, **kept}


async def _settling_in(
    broker: Broker, stream: str, of_kind: Callable[[str], str]
) -> dict[str, list[Event]]:
    stored: list[StoredMessage] = []
    with contextlib.suppress(StreamNotFound):  # REACH_SETTLED not provisioned yet
        for kind in SETTLING:
            stored += await read_stream(broker, stream, of_kind(kind), limit=LETTERS_READ)
    settled: dict[str, list[Event]] = {}
    for message in sorted(stored, key=lambda m: m.stream_seq):
        with contextlib.suppress(envelopes.DecodeError):
            event = envelopes.decode_stored_event(message.data, message.headers)
            settled.setdefault(event.message_id, []).append(event)
    return settled


def _readable(stored: list[StoredMessage]) -> list[DeadLetter]:
    """The dead letters among ``stored``; anything else in the stream (anyone allowed to
    publish there may put it there) is named on stderr and skipped, not fatal."""
    letters: list[DeadLetter] = []
    for message in stored:
        try:
            letters.append(envelopes.decode_dead_letter(message.data, message.headers, stored=True))
        except envelopes.DecodeError as exc:
            print(
                f"reach: skipped message {message.stream_seq} of the stream ({message.subject}):"
                f" not a dead letter: {exc}",
                file=sys.stderr,
            )
    return letters


def _find(letters: list[DeadLetter], args: argparse.Namespace) -> DeadLetter:
    """The newest letter of the id asked for (one per life of the id), or the one ``--at``."""
    message_id, at_ms = args.id, args.at
    lives = [letter for letter in letters if letter.message_id == message_id]
    if not lives:
        raise UsageError(f"no dead letter with message_id {message_id!r}{_among(args)}")
    if at_ms is None:
        if len(lives) > 1:
            print(
                f"{message_id} has {len(lives)} dead letters (at_ms"
                f" {', '.join(str(x.at_ms) for x in lives)}): this is the newest's; --at"
                " AT_MS picks another",
                file=sys.stderr,
            )
        return lives[-1]
    for letter in lives:
        if letter.at_ms == at_ms:
            return letter
    raise UsageError(
        f"no dead letter of {message_id!r} at {at_ms}: its letters are at"
        f" {', '.join(str(x.at_ms) for x in lives)}"
    )
