"""``reach publish TOPIC JSON``: send a task, and with ``--wait`` print its result."""

from __future__ import annotations

import argparse
import json

from agentreach.agents import ReachClient
from agentreach.cli.options import Commands, broker_of, json_argument


def register(commands: Commands) -> None:
    pub = commands.add("publish", cmd_publish, "publish a task: TOPIC JSON")
    pub.add_argument("topic")
    pub.add_argument("json")
    pub.add_argument("--priority", choices=["P0", "P1", "P2"], default="P1")
    pub.add_argument("--ttl-ms", type=int, default=None)
    pub.add_argument("--trace-id", default=None)
    pub.add_argument("--message-id", default=None)
    pub.add_argument("--wait", action="store_true", help="wait for the result and print it")


async def cmd_publish(args: argparse.Namespace) -> int:
    payload = json_argument(args.json)
    async with broker_of(args) as broker, ReachClient(broker=broker) as client:
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
