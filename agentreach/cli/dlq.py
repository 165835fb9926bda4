"""``reach dlq list | show ID | replay ID | stats``: the dead letters of ``REACH_DLQ``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter

import msgspec

from agentreach import envelopes
from agentreach.agents.compensation import replay
from agentreach.broker import Broker, read_stream
from agentreach.broker.streams import StoredMessage, subject_counts
from agentreach.cli.options import Commands, UsageError, broker_of, names_of, operators_only
from agentreach.cli.status import warn_without_coordinator
from agentreach.envelopes import DeadLetter


def register(commands: Commands) -> None:
    dlq = commands.add(
        "dlq",
        cmd_dlq,
        "dead letters: list | show ID | replay ID | stats",
        example=(
            "reach dlq list --reason expired",
            "reach dlq show 0190f3c2-…",
            "reach dlq replay 0190f3c2-… --to-topic manual_review",
        ),
    )
    dlq.add_argument(
        "action",
        choices=["list", "show", "replay", "stats"],
        help="list them, show one (JSON), replay one as a new task, or count them",
    )
    dlq.add_argument("id", nargs="?", help="show, replay: the dead letter's message_id")
    dlq.add_argument("--to-topic", default=None, help="replay to another topic")
    dlq.add_argument("--reason", default=None, help="only letters with this reason")
    dlq.add_argument("--topic", default=None, help="only letters of this topic")


async def cmd_dlq(args: argparse.Namespace) -> int:
    if args.action in ("show", "replay") and not args.id:
        raise UsageError(f"dlq {args.action} needs the message_id of a dead letter")
    if args.action in ("list", "stats") and args.id:
        raise UsageError(
            f"dlq {args.action} takes no message_id (got {args.id!r}): reach dlq show {args.id}"
        )
    operators_only(args, "the dead-letter stream")
    names = names_of(args)
    async with broker_of(args) as broker:
        stored = await read_stream(
            broker, names.dlq_stream, names.dlq(args.reason or "*", args.topic or "*")
        )
        letters = _readable(stored)
        filtered = args.reason or args.topic
        there = await _there(broker) if not letters and filtered and args.action == "list" else {}
        replays = await _replays(broker) if args.action in ("list", "replay") else {}
        if args.action == "replay":
            if before := replays.get(args.id):
                print(
                    f"reach: {args.id} was replayed before (as {', '.join(before)});"
                    " replaying it again runs it again",
                    file=sys.stderr,
                )
            task = await replay(broker, _find(letters, args.id), topic=args.to_topic)
            await warn_without_coordinator(broker, "the replayed task waits in REACH_TASKS")
            print(json.dumps({"message_id": task.message_id, "trace_id": task.trace_id}))
            return 0
    if args.action == "show":
        letter = msgspec.to_builtins(_find(letters, args.id))
        print(json.dumps(letter, indent=2, ensure_ascii=False))
    elif args.action == "stats":
        _print_stats(letters)
    elif not letters and (args.reason or args.topic):
        _print_none_matching(args.reason, args.topic, there)
    else:
        _print_letters(letters, replays)
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


def _print_none_matching(
    reason: str | None, topic: str | None, there: dict[str, Counter[str]]
) -> None:
    """No letter matches the filters: which reasons and topics there are (a typo shows)."""
    wanted = [f"{key} {value!r}" for key, value in (("reason", reason), ("topic", topic)) if value]
    print(f"no dead letters with {' and '.join(wanted)}")
    for key, counter in there.items():
        if counter:
            listed = ", ".join(f"{name} {n}" for name, n in sorted(counter.items()))
            print(f"reach: the {key}s there are: {listed}", file=sys.stderr)


async def _replays(broker: Broker) -> dict[str, list[str]]:
    """Each replayed letter's message id, and what it was replayed as (``replayed`` events)."""
    names = broker.names
    stored = await read_stream(broker, names.events_stream, names.events_of_kind("replayed"))
    replays: dict[str, list[str]] = {}
    for message in stored:
        with contextlib.suppress(envelopes.DecodeError):
            event = envelopes.decode_event(message.data)
            replays.setdefault(event.message_id, []).append(str(event.detail.get("replayed_as")))
    return replays


def _readable(stored: list[StoredMessage]) -> list[DeadLetter]:
    """The dead letters among ``stored``; anything else in the stream (anyone allowed to
    publish there may put it there) is named on stderr and skipped, not fatal."""
    letters: list[DeadLetter] = []
    for message in stored:
        try:
            letters.append(envelopes.decode_dead_letter(message.data))
        except envelopes.DecodeError as exc:
            print(
                f"reach: skipped message {message.stream_seq} of the stream ({message.subject}):"
                f" not a dead letter: {exc}",
                file=sys.stderr,
            )
    return letters


def _find(letters: list[DeadLetter], message_id: str) -> DeadLetter:
    for letter in reversed(letters):
        if letter.message_id == message_id:
            return letter
    raise UsageError(f"no dead letter with message_id {message_id!r}")


def _print_letters(letters: list[DeadLetter], replays: dict[str, list[str]]) -> None:
    if not letters:
        print("no dead letters")
        return
    print(f"{'MESSAGE_ID':<38} {'REASON':<18} {'TOPIC':<20} {'REPLAYED':<9} ERROR")
    for letter in letters:
        error = letter.error.message if letter.error else ""
        replayed = "yes" if letter.message_id in replays else "-"
        print(
            f"{letter.message_id:<38} {letter.reason:<18} {letter.topic:<20} {replayed:<9} {error}"
        )


def _print_stats(letters: list[DeadLetter]) -> None:
    counts = Counter((letter.reason, letter.topic) for letter in letters)
    for (reason, topic), count in sorted(counts.items()):
        print(f"{reason:<20} {topic:<24} {count:>6}")
    print(f"{'total':<45} {len(letters):>6}")
