"""``reach publish TOPIC JSON``: send a task as a caller (``client``, or the name in the
creds), and with ``--wait`` follow it to its result; ``--count N`` sends a burst at the pace
intake takes it (nothing dropped, unlike a core ``nats pub --count``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Callable

from agentreach.agents import DeadlineExceeded, NotAcknowledged, ReachClient, Rejected, TaskFailed
from agentreach.agents.coordinator_presence import NONE_FOR_S
from agentreach.cli.exit_codes import OK, OutcomeUnknown
from agentreach.cli.options import (
    Commands,
    UsageError,
    a_topic,
    broker_of,
    json_argument,
    json_text,
)
from agentreach.cli.status import coordinators, none_answering
from agentreach.envelopes import DEAD_LETTER_REASONS, MAX_TTL_MS, Ack, Budget, Progress
from agentreach.errors import ReachError


def register(commands: Commands) -> None:
    pub = commands.add(
        "publish",
        cmd_publish,
        "publish a task as a caller: TOPIC JSON",
        example=(
            """reach publish summarize '{"text": "NATS is fast. Agents are many."}' --wait""",
            'reach publish refund_application \'{"order_id": "1"}\' --priority P0 --ttl-ms 8000',
            "reach publish summarize @article.json   # or: ... summarize - < article.json",
            """reach publish echo '{"n": {{Count}}}' --count 5000   # a burst, each one stored""",
        ),
    )
    pub.add_argument(
        "topic",
        type=a_topic,
        help="the intent, e.g. summarize. The task is sent as a caller, as ReachClient sends"
        " it: on reach.task.TOPIC.client (the caller `client`; with --creds, the name in them),"
        " so that caller's quota (rate_limits.callers) and its backlog bound on the topic apply"
        " (`nats pub reach.task.TOPIC` is the operators' bare form, which no quota limits)",
    )
    pub.add_argument(
        "json", help="the payload, as JSON; @FILE reads it from FILE, - from stdin (a large one)"
    )
    pub.add_argument(
        "--priority", choices=["P0", "P1", "P2"], default="P1", help="P0 most urgent (default P1)"
    )
    pub.add_argument(
        "--ttl-ms", type=int, default=None, help="how long the task may live (default 30000)"
    )
    pub.add_argument(
        "--execute-ms",
        type=int,
        default=None,
        help="how long a run may take once an agent accepted it (default 30000; with --wait,"
        " the ttl); a workflow's steps get it as theirs",
    )
    pub.add_argument("--trace-id", default=None, help="the trace to join (default: a new one)")
    pub.add_argument(
        "--message-id", default=None, help="the task's id; publishing it twice runs it once"
    )
    pub.add_argument(
        "--wait",
        action="store_true",
        help="follow the task: print its acknowledgement and progress (stderr), then the result",
    )
    pub.add_argument(
        "--count",
        type=int,
        default=1,
        help="send N tasks (each its own id; {{Count}} in JSON is its number, from 1): while"
        " the intake holds as many of yours on the topic as it keeps, wait for room",
    )
    pub.add_argument(
        "--ack-ms",
        type=int,
        default=2000,
        help="with --wait: how long an agent may take to accept it (default 2000)",
    )


async def cmd_publish(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise UsageError(f"--count takes a number of tasks, 1 or more, got {args.count}")
    text = json_text(args.json)

    def payload_of(number: int) -> object:  # {{Count}}: each task's number, from 1
        return json_argument(text.replace("{{Count}}", str(number)), "the PAYLOAD")

    payload = payload_of(1)  # a bad one is refused before anything is sent
    if args.ttl_ms is not None and not 0 < args.ttl_ms <= MAX_TTL_MS:
        raise UsageError(
            f"--ttl-ms takes a number of ms from 1 to {MAX_TTL_MS} (a day), got {args.ttl_ms}"
        )
    if args.execute_ms is not None and not 0 < args.execute_ms <= MAX_TTL_MS:
        raise UsageError(
            f"--execute-ms takes a number of ms from 1 to {MAX_TTL_MS} (a day),"
            f" got {args.execute_ms}"
        )
    if args.count > 1 and (args.wait or args.message_id):
        raise UsageError("--count sends tasks of their own ids: not with --wait or --message-id")
    async with broker_of(args) as broker, ReachClient(broker=broker) as client:
        running = await coordinators(client.broker, none_for_s=NONE_FOR_S if args.wait else 0)
        why_none = "" if running else await none_answering(client.broker)
        if args.count > 1:
            await _burst(client, args, payload_of)
            return _warned(why_none)
        if args.wait:
            if why_none:
                raise UsageError(f"{why_none} (so nothing would route the task: not published)")
            return await _wait(client, args, payload)
        message_id, trace_id = await client.publish(
            args.topic,
            payload,
            priority=args.priority,
            trace_id=args.trace_id,
            message_id=args.message_id,
            ttl_ms=args.ttl_ms,
            budget=_budget(args),
        )
    print(json.dumps({"message_id": message_id, "trace_id": trace_id}))
    return _warned(why_none)


def _budget(args: argparse.Namespace) -> Budget | None:
    return None if args.execute_ms is None else Budget(execute_ms=args.execute_ms)


def _warned(why_none: str) -> int:
    """0; said on stderr first when no coordinator answered (``why_none``: why)."""
    if why_none:
        print(
            f"reach: warning: {why_none}; the tasks wait in REACH_TASKS until one routes them,"
            " within their ttl",
            file=sys.stderr,
        )
    return 0


BURST_WINDOW = 64  # publishes in flight


async def _burst(
    client: ReachClient, args: argparse.Namespace, payload_of: Callable[[int], object]
) -> None:
    """``--count`` tasks, printed once all are stored, in order of their number."""
    window = asyncio.Semaphore(BURST_WINDOW)

    async def one(number: int) -> tuple[str, str]:
        async with window:
            return await client.publish(
                args.topic,
                payload_of(number),
                priority=args.priority,
                trace_id=args.trace_id,
                ttl_ms=args.ttl_ms,
                budget=_budget(args),
            )

    sent = await asyncio.gather(*(one(n) for n in range(1, args.count + 1)))
    for message_id, trace_id in sent:
        print(json.dumps({"message_id": message_id, "trace_id": trace_id}))
    print(
        f"published {len(sent)} tasks on {args.topic} (stored; the coordinator may still refuse"
        " some: a caller's quota, a topic's limits — each a `rejected` event in `reach trace ID`,"
        " and `reach dlq list --reason rejected`, though refusals past a quota's own pace are"
        " not dead-lettered)",
        file=sys.stderr,
    )


async def _wait(client: ReachClient, args: argparse.Namespace, payload: object) -> int:
    ttl_ms = args.ttl_ms or 30_000

    def acked(ack: Ack) -> None:
        free = f", {ack.capacity.free_slots} free slots" if ack.capacity else ""
        # Only an agent names itself: the coordinator acknowledges a workflow it started, and
        # a task put in a manual-review queue (a progress line then says so).
        who = ack.from_agent or "the coordinator (a workflow started, or manual review)"
        # The id too: Ctrl-C from here on leaves an operator only `reach trace ID` to follow it.
        print(f"accepted by {who}{free} (message {ack.message_id})", file=sys.stderr, flush=True)

    def progressed(progress: Progress) -> None:
        print(f"progress: {progress.note or '(still working)'}", file=sys.stderr, flush=True)

    try:
        result = await client.invoke(
            args.topic,
            payload,
            priority=args.priority,
            trace_id=args.trace_id,
            message_id=args.message_id,
            ttl_ms=ttl_ms,
            ack_deadline_ms=min(args.ack_ms, ttl_ms),
            execute_deadline_ms=args.execute_ms or ttl_ms,
            on_ack=acked,
            on_progress=progressed,
        )
    except (NotAcknowledged, DeadlineExceeded) as exc:
        # Neither ends the task: say so before an operator sends it again under a new id.
        said = _PYTHON_ADVICE.sub("", str(exc))  # the CLI's own advice follows
        # Not acknowledged, it may start within its ttl; accepted, it runs (a handler that
        # cannot be stopped, past its execute budget) and may still complete.
        if isinstance(exc, NotAcknowledged) and _TTL_PASSED in said:
            may = "will not start now"
        elif isinstance(exc, NotAcknowledged):
            may = f"may still run (it may start until its ttl, {ttl_ms} ms)"
        else:
            may = "may still complete"
        raise OutcomeUnknown(
            f"{said}; {exc.message_id} {may}: follow it with `reach trace {exc.message_id}`;"
            f" to wait for it again, send it with --message-id {exc.message_id} (a new id"
            " would run it a second time)"
        ) from None
    except TaskFailed as exc:
        raise TaskEnded(how_it_ended(exc)) from None
    print(json.dumps(result, ensure_ascii=False))
    return OK


# What ReachClient's errors advise in Python terms ("invoke again with message_id=…").
# The part that "may still run" would say again (exit 3's own line) goes with it.
_PYTHON_ADVICE = re.compile(
    r"((; it stays queued and may still run within its ttl)?: invoke again with"
    r" message_id=\S+ to hear how it end(s|ed)|; it may still complete: invoke again with"
    r" message_id=\S+ to hear how it ends)"
)
_TTL_PASSED = "has passed, so no agent will start it"


class TaskEnded(ReachError):
    """The task ended without a result: said as its ending, not as a bare error."""


def how_it_ended(exc: TaskFailed) -> str:
    """``retries_exhausted after 3 attempts, dead-lettered: AttributeError: …``, and where
    to read more: the ending, the attempts a handler ran, whether a dead letter holds it."""
    said = exc.ending or "failed"
    ran = not isinstance(exc, Rejected)
    count = exc.attempts if exc.attempts is not None else exc.attempt
    # One attempt is worth saying only of retries that ran out ("workflow_failed after 1
    # attempt" read as if the workflow had been retried).
    if ran and count and (count > 1 or exc.ending == "retries_exhausted"):
        said += f" after {count} attempt{'s' if count > 1 else ''}"
    lettered = exc.ending in DEAD_LETTER_REASONS
    if lettered:
        said += ", dead-lettered"
    if not ran:
        said += ", nothing ran"
    more = "reach dlq show" if lettered else "reach trace"
    return f"{said}: {exc.error.type}: {exc.error.message} (`{more} {exc.message_id}`)"
