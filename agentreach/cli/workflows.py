"""``reach workflows list | show ID | cancel ID | signal ID EVENT``, and the workflow trees
``reach trace`` prints: instances as tables and trees. An operator does all of it; a caller
cancels and signals the instances it started (its creds read no records)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from agentreach.agents import DeadlineExceeded, InvalidArgument, ReachClient, UnknownWorkflow
from agentreach.agents.errors import WorkflowActionRefused
from agentreach.agents.workflow_control import ENDINGS, START_GRACE_S
from agentreach.broker import Broker, BrokerTimeout, NoResponders
from agentreach.broker.direct import messages_on
from agentreach.broker.streams import stream_bounds
from agentreach.cli.options import (
    Commands,
    MissingArgument,
    UnparsedArgument,
    UsageError,
    an_id,
    auth_of,
    broker_of,
    non_negative_seconds,
    operators_only,
)
from agentreach.cli.status import NOT_RUNNING, warn_without_coordinator
from agentreach.cli.workflow_views import clock, table, tree
from agentreach.coordinator.workflows import all_records, cancel, read_record, signal
from agentreach.envelopes import (
    WorkflowRecord,
    decode_stored_event,
    encode,
    is_token,
    now_ms,
)

LONG_AGO_MS = 60_000  # an instance that ended before that was not the one just started
LISTED = "`reach workflows list` lists them"


def register(commands: Commands) -> None:
    flows = commands.add(
        "workflows",
        cmd_workflows,
        "workflow instances: list | show ID | cancel ID [WHY] | signal ID EVENT",
        example=(
            "reach workflows show article-1",
            "reach workflows signal order-7 paid",
            'reach workflows cancel order-7 "customer withdrew"',
        ),
    )
    flows.add_argument(
        "action",
        choices=["list", "show", "cancel", "signal"],
        help="list instances, show one's steps, cancel it, or signal it an event (with a"
        " caller's creds: cancel or signal, an instance it started)",
    )
    flows.add_argument(
        "id", nargs="?", type=an_id, help="the instance id (the starting task's message_id)"
    )
    flows.add_argument(
        "event",
        nargs="?",
        help="signal: the event to send; cancel: why (the instance's error message)",
    )
    flows.add_argument(
        "--wait", type=non_negative_seconds, default=10.0, help="cancel, signal: seconds to wait"
    )
    flows.add_argument(
        "--json",
        action="store_true",
        help="list, show: the instance records as JSON (list: one per line), for scripts",
    )


async def cmd_workflows(args: argparse.Namespace) -> int:
    if args.action != "list" and not args.id:
        raise MissingArgument(f"workflows {args.action} needs the id of a workflow instance")
    if args.json and args.action not in ("list", "show"):
        raise UsageError("--json is for workflows list and show")
    if args.event and args.action in ("list", "show"):
        raise UnparsedArgument(f"workflows {args.action} takes no argument after the id")
    if args.action == "signal" and not args.event:
        raise MissingArgument("workflows signal needs an event name: workflows signal ID EVENT")
    if args.action == "signal" and not is_token(args.event):
        # A dot would make the subject another caller's signal (its last token the asker).
        raise UsageError(
            f"event {args.event!r}: an event is one subject token (letters, digits, '-', '_';"
            " no dots, spaces or wildcards)"
        )
    if args.action in ("cancel", "signal") and auth_of(args).role == "caller":
        async with broker_of(args) as broker, ReachClient(broker=broker) as client:
            if args.action == "signal":
                return await _signal_own(client, args.id, args.event, args.wait)
            return await _cancel_own(client, args.id, args.event or "", args.wait)
    acts = args.action in ("cancel", "signal")  # a caller's own instances only (above)
    operators_only(args, f"workflows {args.action}" if acts else "reading the workflow records")
    async with broker_of(args) as broker:
        if args.action == "list":
            records = await all_records(broker)
            print("\n".join(map(as_json, records)) if args.json else table(records))
            return 0
        acting = args.action in ("cancel", "signal")  # maybe just after the start: waits
        if (record := await read_record(broker, args.id, within_s=acting * START_GRACE_S)) is None:
            waited = f" within {START_GRACE_S:g} s (its start may still wait in the intake)"
            raise UsageError(
                f"no workflow instance {args.id!r}{waited * acting}; {LISTED}, and"
                f" `reach trace {args.id}` says what became of a start of that id (one refused"
                " at intake, say, is dead-lettered)"
            )
        if args.action == "show":
            print(as_json(record) if args.json else tree(record))
            return 0
        if record.finished:
            print(already(args.id, record.status, record.ended_ms, now_ms()))
            return 1
        await warn_without_coordinator(broker, "nothing acts on it until one starts")
        if args.action == "signal":
            return await _signal(broker, record, args.event, args.wait)
        await cancel(broker, args.id, why=args.event or "")
        ended = await _until_finished(broker, args.id, args.wait)
    if ended is None:
        print(f"{args.id}: cancel requested")
        return 0
    print(tree(ended))
    if not ended.finished:
        print(f"{args.id}: cancel requested; {_still(ended, args.wait)}")
    elif ended.status != "cancelled":  # it ended otherwise between the read and the cancel
        print(f"{args.id}: {ended.status} before the cancel took effect")
        return 1
    return 0


async def _cancel_own(client: ReachClient, instance_id: str, why: str, wait_s: float) -> int:
    """A caller cancels an instance it started (it may not read the records: the
    coordinator tells it its instance's events)."""
    try:
        ended = await client.cancel_workflow(instance_id, why=why, wait_s=wait_s)
    except UnknownWorkflow as exc:
        raise UsageError(f"{exc}; an operator's creds cancel any") from None
    except (NoResponders, BrokerTimeout):
        raise UsageError(f"{NOT_RUNNING}: a caller cancels through it") from None
    except WorkflowActionRefused as exc:
        print(exc)
        return 1
    except DeadlineExceeded:
        print(
            f"{instance_id}: cancel requested; not ended after {wait_s:g} s (what it"
            " completed may still be being undone)"
        )
        return 0
    if ended.before_cancel:
        print(already(instance_id, ended.status, ended.at_ms, now_ms()))
        return 1
    if ended.status != "cancelled":
        print(f"{instance_id}: {ended.status} before the cancel took effect")
        return 1
    print(f"{instance_id}: cancelled")
    return 0


async def _signal_own(client: ReachClient, instance_id: str, event: str, wait_s: float) -> int:
    """A caller signals an instance it started: 0 when a state took the event."""
    try:
        outcome = await client.signal_workflow(instance_id, event, wait_s=wait_s)
    except UnknownWorkflow as exc:
        raise UsageError(f"{exc}; an operator's creds signal any") from None
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from None
    except (NoResponders, BrokerTimeout):
        raise UsageError(
            f"{NOT_RUNNING}: a caller signals through it (or these creds may not signal:"
            " issued before signals, they need `reach auth push` by an operator)"
        ) from None
    except DeadlineExceeded:
        print(f"{instance_id}: signalled {event}; no answer yet after {wait_s:g} s")
        return 0
    except WorkflowActionRefused as exc:
        print(exc)
        return 1
    if outcome.ended is not None:
        print(f"{instance_id}: already {outcome.ended}; {event} not sent")
        return 1
    if outcome.taken:
        print(f"{instance_id}: {event} taken in state {outcome.state or '-'}")
        return 0
    takes = f": it takes {', '.join(outcome.waits_for)}" if outcome.waits_for else ""
    print(f"{instance_id}: no state waits for {event}{takes}; not taken")
    return 1


def as_json(record: WorkflowRecord) -> str:
    """An instance's record as it is stored (schemas/coordination/workflow.json)."""
    return encode(record).decode()


def already(instance_id: str, status: str, ended_ms: int, now: int) -> str:
    """An instance ended before its cancel or signal: say when. One that ended a while ago
    may be a surprise: an id used before (the README's ``Nats-Msg-Id:article-1``, say, sent
    again after a restart) names the instance that ran then, whatever was sent since."""
    said = f"{instance_id}: already {status} at {clock(ended_ms)}"
    if now - ended_ms < LONG_AGO_MS:
        return said
    return (
        f"{said}, {(now - ended_ms) // 60_000} min ago (if you sent its start again since"
        " to run it anew: a start under an id used before is answered from that instance,"
        " not run again; send it under a new message id)"
    )


def _still(record: WorkflowRecord, wait_s: float) -> str:
    """What an instance still does after ``wait_s``: runs, or undoes what it did (first
    waiting for the outcome of the steps it stopped while they ran)."""
    if record.status != "compensating":
        return f"still {record.status} after {wait_s:g} s"
    waiting = f", waiting for {', '.join(record.awaiting)}" if record.awaiting else ""
    return f"compensating after {wait_s:g} s{waiting}"


async def _signal(broker: Broker, record: WorkflowRecord, event: str, wait_s: float) -> int:
    """Send ``event`` and say whether a state took it (0) or none waits for it (1)."""
    if record.current is None:  # a chain, fan-out or graph: no state ever waits for one
        why = f"{record.workflow!r} is no state machine, and only a state machine's states take"
        print(f"{record.instance_id}: not sent: {why} events")
        return 1
    # Only what is stored after it answers it: the same event sent a moment before has its own.
    _, sent_after = await stream_bounds(broker, broker.names.events_stream)
    seq = await signal(broker, record.instance_id, event)
    deadline = asyncio.get_running_loop().time() + wait_s
    state = f"in state {record.current}"
    while asyncio.get_running_loop().time() < deadline:
        # Said by the coordinator's own event: a record that changed meanwhile may have moved
        # for another reason (the state's wait ran out just before, and the signal came late).
        match await _answer(broker, record, event, (sent_after, seq)):
            case ("signal_taken", detail):
                now = await read_record(broker, record.instance_id)
                after = f"; now {now.current or now.status}" if now is not None else ""
                print(f"{record.instance_id}: {event} taken in state {detail.get('state')}{after}")
                return 0
            case ("signal_ignored", detail) if detail.get("ended") is None:
                waits = detail.get("waits_for") or []
                takes = f"; it takes {', '.join(waits)}" if waits else ""
                now = await read_record(broker, record.instance_id)
                there = f"in state {now.current}" if now is not None else state
                print(
                    f"{record.instance_id}: no state waits for {event} ({there}{takes}); not taken"
                )
                return 1
            case (said, detail):  # the instance ended first, or instead of taking it
                ended = detail.get("ended") or ENDINGS[said]
                error = (detail.get("error") or {}).get("message")
                why = f": {error}" if error else ""
                print(f"{record.instance_id}: {event} not taken: the instance {ended}{why}")
                return 1
        await asyncio.sleep(0.1)  # a person is waiting at the terminal; polling is fine here
    print(f"{record.instance_id}: signalled {event} ({state}); no answer yet")
    return 0


async def _answer(
    broker: Broker, record: WorkflowRecord, event: str, sent: tuple[int, int]
) -> tuple[str, dict[str, Any]] | None:
    """What the coordinator did with ``event`` (sent as the signal at sequence ``sent[1]``),
    said in an event of the instance's trace stored after ``sent[0]`` in the events stream:
    ``signal_taken`` or ``signal_ignored`` naming its workflow and that signal (ignored: with
    the events its state takes), or the instance's ending when it ended first (the signal
    outgrew its record, say). The events are read in the order stored: a signal that ends
    the instance is said taken before the ending."""
    after_seq, seq = sent
    names = broker.names
    stored = await messages_on(
        broker, names.events_stream, names.events_of_trace(record.trace_id), from_seq=after_seq + 1
    )
    for message in stored:
        seen = decode_stored_event(message.data, message.headers)
        if seen.event in ENDINGS and seen.message_id == record.instance_id:
            return seen.event, seen.detail
        said_in = {"signal_taken": "event", "signal_ignored": "signal"}.get(seen.event)
        if (
            said_in is not None
            and seen.detail.get(said_in) == event
            and seen.detail.get("workflow") == record.workflow
            and seen.detail.get("signal_seq") in (None, seq)  # not another's sent at once
        ):
            return seen.event, seen.detail
    return None


async def _until_finished(broker: Broker, instance_id: str, wait_s: float) -> WorkflowRecord | None:
    """The record once it has finished, or the latest one after ``wait_s``."""
    deadline = asyncio.get_running_loop().time() + wait_s
    record = await read_record(broker, instance_id)
    while record is not None and not record.finished:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)  # a person is waiting at the terminal; polling is fine here
        record = await read_record(broker, instance_id)
    return record
