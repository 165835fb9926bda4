"""The ``reach`` command line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import nats.errors

from agentreach import envelopes
from agentreach.agents import Agent, ReachClient, ReachError
from agentreach.agents.compensation import replay
from agentreach.broker import (
    DEFAULT_URL,
    Broker,
    BrokerError,
    Names,
    Topology,
    provision,
    read_stream,
)
from agentreach.cli import agents_table, workflows_view
from agentreach.cli import trace as tracing
from agentreach.cli.logs import configure_logging
from agentreach.cli.serving import nats_server, provisioned, until_signal
from agentreach.coordinator import ConfigError, Coordinator, load_config
from agentreach.coordinator.routes import ReloadReply
from agentreach.coordinator.workflows import cancel as workflow_cancel
from agentreach.coordinator.workflows import read_record
from agentreach.coordinator.workflows import signal as workflow_signal
from agentreach.envelopes import DeadLetter, EnvelopeError


class UsageError(Exception):
    """A mistake in the command line."""


USER_ERRORS = (ReachError, BrokerError, EnvelopeError, ConfigError, UsageError)

Command = Callable[[argparse.Namespace], Awaitable[int]]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``reach`` console script."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return asyncio.run(args.command(args))
    except USER_ERRORS as exc:
        print(f"reach: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# -- commands ---------------------------------------------------------------------
async def cmd_up(args: argparse.Namespace) -> int:
    """Embedded nats-server (unless --nats-url / $NATS_URL), provision, coordinator."""
    async with nats_server(args.nats_url, port=args.port, data_dir=args.data_dir) as url:
        await _coordinate(url, args)
    return 0


async def cmd_coordinator(args: argparse.Namespace) -> int:
    await _coordinate(args.nats_url or DEFAULT_URL, args)
    return 0


async def _coordinate(url: str, args: argparse.Namespace) -> None:
    config = load_config(args.config)
    names = Names(prefix=args.prefix or config.prefix)
    async with (
        provisioned(
            url, names, name="coordinator", queue_capacity=config.queues.capacities
        ) as broker,
        Coordinator(broker, config, config_path=args.config).running(),
    ):
        await until_signal(f"coordinator serving on {url}")


async def cmd_agent(args: argparse.Namespace) -> int:
    agent = _load_agent(args.target)
    if args.startup_delay is not None:
        agent.startup_delay = args.startup_delay
    async with agent.running(args.nats_url or DEFAULT_URL, names=_names(args)):
        await until_signal(f"agent {agent.agent_id} serving {sorted(agent.handlers)}")
    return 0


async def cmd_publish(args: argparse.Namespace) -> int:
    payload = _json_argument(args.json)
    async with ReachClient(args.nats_url, names=_names(args), name="reach-cli") as client:
        if args.wait:
            result = await client.invoke(
                args.topic, payload, priority=args.priority, trace_id=args.trace_id
            )
            print(json.dumps(result, ensure_ascii=False))
            return 0
        message_id, trace_id = await client.publish(
            args.topic,
            payload,
            priority=args.priority,
            trace_id=args.trace_id,
            message_id=args.message_id,
            ttl_ms=args.ttl_ms,
        )
    print(json.dumps({"message_id": message_id, "trace_id": trace_id}))
    return 0


async def cmd_trace(args: argparse.Namespace) -> int:
    async with Broker(args.nats_url, names=_names(args), name="reach-cli") as broker:
        steps = await tracing.collect(broker, args.id)
        instances = {args.id} | {
            s.event.message_id for s in steps if s.event.event == "workflow_started"
        }
        records = [r for i in sorted(instances) if (r := await read_record(broker, i))]
    for record in records:
        print(workflows_view.tree(record))
    print(tracing.render(args.id, steps))
    return 0 if steps or records else 1


async def cmd_workflows(args: argparse.Namespace) -> int:
    if args.action != "list" and not args.id:
        raise UsageError(f"workflows {args.action} needs the id of a workflow instance")
    if args.action == "signal" and not args.event:
        raise UsageError("workflows signal needs an event name: workflows signal ID EVENT")
    async with Broker(args.nats_url, names=_names(args), name="reach-cli") as broker:
        if args.action == "list":
            print(workflows_view.table(await workflows_view.all_records(broker)))
            return 0
        record = await read_record(broker, args.id)
        if record is None:
            raise UsageError(f"no workflow instance {args.id!r}")
        if args.action == "show":
            print(workflows_view.tree(record))
            return 0
        if record.finished:
            print(f"{args.id}: already {record.status}")
            return 1
        if args.action == "signal":
            await workflow_signal(broker, args.id, args.event)
            print(f"{args.id}: signalled {args.event} (in state {record.current or '-'})")
            return 0
        await workflow_cancel(broker, args.id)
        record = await _until_finished(broker, args.id, args.wait)
    print(workflows_view.tree(record) if record else f"{args.id}: cancel requested")
    return 0


async def _until_finished(broker: Broker, instance_id: str, wait_s: float):  # type: ignore[no-untyped-def]
    """The record once it has finished, or the latest one after ``wait_s``."""
    deadline = asyncio.get_running_loop().time() + wait_s
    record = await read_record(broker, instance_id)
    while record is not None and not record.finished:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)  # a person is waiting at the terminal; polling is fine here
        record = await read_record(broker, instance_id)
    return record


async def cmd_provision(args: argparse.Namespace) -> int:
    names = _names(args)
    capacities = load_config(args.config).queues.capacities
    topology = Topology.default(names, queue_capacity=capacities)
    async with Broker(args.nats_url, names=names, name="reach-cli") as broker:
        outcomes = await provision(broker.js, topology)
    for name, outcome in outcomes.items():
        print(f"{name:<24} {outcome}")
    return 0


async def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(envelopes.json_schema(), indent=2)
    if args.out:
        await asyncio.to_thread(Path(args.out).write_text, text + "\n")
    else:
        print(text)
    return 0


async def cmd_agents(args: argparse.Namespace) -> int:
    async with Broker(args.nats_url, names=_names(args), name="reach-cli") as broker:
        if args.action == "clear":
            return await _clear(broker, args.id)
        while True:
            table = agents_table.render(await agents_table.collect(broker))
            if not args.watch:
                print(table)
                return 0
            print("\033[2J\033[H" + table, flush=True)  # clear the screen, then redraw
            await asyncio.sleep(args.watch)


async def _clear(broker: Broker, agent_id: str | None) -> int:
    if not agent_id:
        raise UsageError("agents clear needs the id of a quarantined agent")
    try:
        answer = await broker.nc.request(broker.names.clear, agent_id.encode(), timeout=5)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        raise UsageError(
            "no coordinator answered; is `reach up` or `reach coordinator` running?"
        ) from None
    print(f"{agent_id}: {answer.data.decode()}")
    return 0 if answer.data == b"cleared" else 1


async def cmd_routes(args: argparse.Namespace) -> int:
    if args.action == "check":
        if not args.file:
            raise UsageError("routes check needs the config file to check")
        routing = load_config(args.file).routing
        for rule in routing.rules:
            print(f"{rule.name:<24} {'fallback' if rule.fallback else rule.match.topic}")
        print(f"{args.file}: {len(routing.rules)} rules, fallback {routing.fallback.name!r}")
        return 0
    async with Broker(args.nats_url, names=_names(args), name="reach-cli") as broker:
        answers = await gather_replies(broker, broker.names.routes_reload, wait_s=args.wait)
    if not answers:
        raise UsageError("no coordinator answered; is `reach up` or `reach coordinator` running?")
    failed = 0
    for answer in answers:
        reply = msgspec.json.decode(answer, type=ReloadReply)
        if reply.ok:
            print(f"{reply.replica}: reloaded {len(reply.rules)} rules: {', '.join(reply.rules)}")
        else:
            failed += 1
            print(f"{reply.replica}: not reloaded: {reply.error}")
    return 1 if failed else 0


async def gather_replies(broker: Broker, subject: str, *, wait_s: float) -> list[bytes]:
    """Ask every listener on ``subject`` and collect the answers that come within ``wait_s``."""
    inbox = broker.nc.new_inbox()
    answers: list[bytes] = []
    sub = await broker.nc.subscribe(inbox)
    try:
        await broker.nc.publish(subject, b"", reply=inbox)
        deadline = asyncio.get_running_loop().time() + wait_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                answer = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            if answer.data:  # an empty one is the server's "no responders" status
                answers.append(answer.data)
    finally:
        await sub.unsubscribe()
    return answers


async def cmd_dlq(args: argparse.Namespace) -> int:
    if args.action in ("show", "replay") and not args.id:
        raise UsageError(f"dlq {args.action} needs the message_id of a dead letter")
    names = _names(args)
    async with Broker(args.nats_url, names=names, name="reach-cli") as broker:
        stored = await read_stream(
            broker.js, names.dlq_stream, names.dlq(args.reason or "*", args.topic or "*")
        )
        letters = [envelopes.decode_dead_letter(m.data) for m in stored]
        if args.action == "replay":
            task = await replay(broker, _find(letters, args.id), topic=args.to_topic)
            print(json.dumps({"message_id": task.message_id, "trace_id": task.trace_id}))
            return 0
    if args.action == "show":
        print(
            json.dumps(msgspec.to_builtins(_find(letters, args.id)), indent=2, ensure_ascii=False)
        )
    elif args.action == "stats":
        _print_stats(letters)
    else:
        _print_letters(letters)
    return 0


def _find(letters: list[DeadLetter], message_id: str) -> DeadLetter:
    for letter in reversed(letters):
        if letter.message_id == message_id:
            return letter
    raise UsageError(f"no dead letter with message_id {message_id!r}")


def _print_letters(letters: list[DeadLetter]) -> None:
    for letter in letters:
        error = letter.error.message if letter.error else ""
        print(f"{letter.message_id:<38} {letter.reason:<18} {letter.topic:<20} {error}")
    if not letters:
        print("no dead letters")


def _print_stats(letters: list[DeadLetter]) -> None:
    counts = Counter((letter.reason, letter.topic) for letter in letters)
    for (reason, topic), count in sorted(counts.items()):
        print(f"{reason:<20} {topic:<24} {count:>6}")
    print(f"{'total':<45} {len(letters):>6}")


async def cmd_demo(args: argparse.Namespace) -> int:
    from agentreach.cli.demo import run_demo

    async with nats_server(args.nats_url, port=args.port, data_dir=args.data_dir) as url:
        return await run_demo(url, _names(args))


# -- helpers ----------------------------------------------------------------------
def _names(args: argparse.Namespace) -> Names:
    return Names(prefix=args.prefix or "reach")


def _json_argument(text: str) -> Any:
    try:
        return envelopes.decode_json(text)
    except envelopes.DecodeError as exc:
        raise UsageError(f"JSON argument is not valid JSON: {exc}") from None


def _load_agent(target: str) -> Agent:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UsageError(
            f"expected MODULE:OBJECT (e.g. agentreach.examples.echo:agent), got {target!r}"
        )
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    agent = getattr(module, attr, None)
    if not isinstance(agent, Agent):
        raise UsageError(f"{target} is {type(agent).__name__}, not an agentreach.Agent")
    return agent


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL"),
        help=f"NATS server (default $NATS_URL, then {DEFAULT_URL})",
    )
    common.add_argument("--prefix", default=None, help="subject prefix (default reach)")
    common.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    common.add_argument("--log-format", default="auto", choices=["auto", "console", "json"])

    parser = argparse.ArgumentParser(prog="reach", description="Agent-Reach over NATS JetStream")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, func: Command, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(command=func)
        return p

    def embedded_options(p: argparse.ArgumentParser, port: int) -> None:
        p.add_argument(
            "--port",
            type=int,
            default=port,
            help=f"embedded server port (default {port}; -1 = any free port)",
        )
        p.add_argument(
            "--data-dir",
            type=Path,
            default=Path(".reach/nats"),
            help="embedded server store (default ./.reach/nats)",
        )

    up = command("up", cmd_up, "run the coordinator, with an embedded nats-server unless a URL")
    embedded_options(up, 4222)
    up.add_argument("--config", help="coordinator YAML config")
    coord = command("coordinator", cmd_coordinator, "run a coordinator replica")
    coord.add_argument("--config", help="coordinator YAML config")
    agent = command("agent", cmd_agent, "serve an Agent object: MODULE:OBJECT")
    agent.add_argument("target", metavar="MODULE:OBJECT")
    agent.add_argument(
        "--startup-delay",
        type=float,
        default=None,
        help="upper bound of the random delay before registering (s)",
    )
    pub = command("publish", cmd_publish, "publish a task: TOPIC JSON")
    pub.add_argument("topic")
    pub.add_argument("json")
    pub.add_argument("--priority", choices=["P0", "P1", "P2"], default="P1")
    pub.add_argument("--ttl-ms", type=int, default=None)
    pub.add_argument("--trace-id", default=None)
    pub.add_argument("--message-id", default=None)
    pub.add_argument("--wait", action="store_true", help="wait for the result and print it")
    tr = command("trace", cmd_trace, "every lifecycle event of a message_id or trace_id")
    tr.add_argument("id")
    prov = command("provision", cmd_provision, "create or update every stream and bucket")
    prov.add_argument("--config", help="coordinator YAML config (its queue capacities)")
    schema = command("schema", cmd_schema, "print the JSON Schema of envelope v1")
    schema.add_argument("--out", help="write to this file instead")
    agents = command("agents", cmd_agents, "registered agents and their liveness | clear ID")
    agents.add_argument("action", nargs="?", choices=["list", "clear"], default="list")
    agents.add_argument("id", nargs="?")
    agents.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        help="redraw every N seconds (default 2) until Ctrl-C",
    )
    flows = command("workflows", cmd_workflows, "workflow instances: list | show ID | cancel ID")
    flows.add_argument("action", choices=["list", "show", "cancel", "signal"])
    flows.add_argument("id", nargs="?")
    flows.add_argument("event", nargs="?", help="for signal: the event to send")
    flows.add_argument("--wait", type=float, default=10.0, help="cancel: seconds to wait for it")
    routes = command("routes", cmd_routes, "routing rules: reload (every replica) | check FILE")
    routes.add_argument("action", choices=["reload", "check"])
    routes.add_argument("file", nargs="?", help="the coordinator config to check")
    routes.add_argument(
        "--wait", type=float, default=1.0, help="seconds to collect replicas' answers (reload)"
    )
    dlq = command("dlq", cmd_dlq, "dead letters: list | show ID | replay ID | stats")
    dlq.add_argument("action", choices=["list", "show", "replay", "stats"])
    dlq.add_argument("id", nargs="?")
    dlq.add_argument("--to-topic", default=None, help="replay to another topic")
    dlq.add_argument("--reason", default=None)
    dlq.add_argument("--topic", default=None)
    demo = command("demo", cmd_demo, "embedded server + coordinator + example agents + tasks")
    embedded_options(demo, -1)
    return parser
