"""``reach manual list | show ID | take ID | answer ID JSON | send ID TOPIC | reject ID WHY``:
the tasks waiting for a person in the manual-review queues (KV ``reach_manual``)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import msgspec

from agentreach.agents.manual import TAKE_S, ManualReview, ManualReviewError
from agentreach.cli.options import (
    Commands,
    MissingArgument,
    UsageError,
    an_id,
    broker_of,
    json_argument,
    operators_only,
)
from agentreach.cli.terminal import one_line
from agentreach.envelopes import ManualItem, now_ms

NEEDS = {"show": "ID", "take": "ID", "answer": "ID JSON", "send": "ID TOPIC", "reject": "ID WHY"}


def register(commands: Commands) -> None:
    manual = commands.add(
        "manual",
        cmd_manual,
        "tasks waiting for a person: list | show ID | take ID | answer ID JSON | send ID TOPIC"
        " | reject ID WHY",
        example=(
            "reach manual list",
            "reach manual take 01J9Z8X3K4 --as alice",
            """reach manual answer 01J9Z8X3K4 '{"refund": "approved"}'""",
            "reach manual send 01J9Z8X3K4 refund_application",
            "reach manual reject 01J9Z8X3K4 'not a request we handle'",
        ),
    )
    manual.add_argument(
        "action", choices=["list", *NEEDS], help="list | show | take | answer | send | reject"
    )
    manual.add_argument("id", nargs="?", type=an_id, help="the waiting task's message_id")
    manual.add_argument(
        "value", nargs="?", help="the answer (JSON), the topic to send to, or why it is rejected"
    )
    manual.add_argument("--queue", default=None, help="only this queue (list)")
    manual.add_argument(
        "--all", action="store_true", help="also answered, sent, rejected and expired"
    )
    manual.add_argument("--as", dest="person", default=None, help="who you are (default $USER)")
    manual.add_argument(
        "--force", action="store_true", help="send to a topic no registered agent serves"
    )
    manual.add_argument(
        "--json",
        action="store_true",
        help="list: one JSON object per item and line (for scripts), not the table",
    )
    manual.add_argument(
        "--for", dest="take_s", type=float, default=TAKE_S, help="seconds a take holds (900)"
    )


async def cmd_manual(args: argparse.Namespace) -> int:
    if args.action in NEEDS and (not args.id or (" " in NEEDS[args.action] and not args.value)):
        raise MissingArgument(f"manual {args.action} needs {NEEDS[args.action]}")
    if args.force and args.action != "send":
        raise UsageError("--force is for manual send")
    if args.json and args.action != "list":
        raise UsageError("--json is for manual list (manual show prints JSON already)")
    operators_only(args, "the manual review queue")
    answer = json_argument(args.value, "the VALUE") if args.action == "answer" else None
    async with broker_of(args) as broker:
        review = ManualReview(broker, by=args.person)
        try:
            return await _act(review, args, answer)
        except ManualReviewError as exc:
            raise UsageError(str(exc)) from None


async def _act(review: ManualReview, args: argparse.Namespace, answer: Any) -> int:
    match args.action:
        case "list":
            items = await review.items(queue=args.queue, closed=args.all)
            if args.json:
                for item in items:
                    print(json.dumps(msgspec.to_builtins(item), ensure_ascii=False))
            else:
                print(render(items))
        case "show":
            item = await review.get(args.id)
            print(json.dumps(msgspec.to_builtins(item), indent=2, ensure_ascii=False))
        case "take":
            item = await review.take(args.id, take_s=args.take_s)
            held_s = (item.taken_until_ms - now_ms()) / 1000
            until = " (until it expires)" if item.taken_until_ms == item.deadline_ms else ""
            print(f"{item.message_id}: taken by {item.taken_by} for {held_s:.0f} s{until}")
        case "answer":
            item = await review.answer(args.id, answer)
            print(f"{item.message_id}: answered by {item.ended_by}; it goes to the caller")
        case "send":
            item = await review.send(args.id, args.value, force=args.force)
            print(json.dumps({"message_id": item.sent_as, "topic": item.sent_to}))
        case "reject":
            item = await review.reject(args.id, args.value)
            print(f"{item.message_id}: rejected by {item.ended_by}; dead-lettered as rejected")
    return 0


def render(items: list[ManualItem]) -> str:
    """One line per item: id, queue, status, age, time left, why, and the start of its text."""
    if not items:
        return "no tasks waiting for a person"
    now = time.time() * 1000
    header = f"{'MESSAGE_ID':<38} {'QUEUE':<10} {'STATUS':<16} {'AGE':>6} {'LEFT':>6}  WHY · TEXT"
    lines = [header]
    for item in items:
        status = item.status
        if holder := item.holder(int(now)):
            status = f"taken:{holder}"
        left = _span((item.deadline_ms - now) / 1000) if item.open else "-"
        lines.append(
            f"{item.message_id:<38} {item.queue:<10} {status:<16}"
            f" {_span((now - item.entered_ms) / 1000):>6} {left:>6}"
            f"  {item.reason} · {_short(item.task.payload)}"
        )
    return "\n".join(lines)


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _short(payload: Any, width: int = 60) -> str:
    text = one_line(
        payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    )
    return text if len(text) <= width else text[: width - 1] + "…"
