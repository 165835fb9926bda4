"""``reach schema [NAME] [--all] [--out PATH]``: the JSON Schemas of the records on the wire."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from agentreach.cli.options import Commands, UsageError
from agentreach.envelopes.schema import RECORDS, all_schemas, json_schema, render


def register(commands: Commands) -> None:
    schema = commands.add(
        "schema",
        cmd_schema,
        "print the JSON Schema of envelope v1, of one record (NAME), or of every record (--all)",
        example=("reach schema task", "reach schema --all --out schemas"),
    )
    schema.add_argument("name", nargs="?", metavar="NAME", help="e.g. task, agent_card, …")
    schema.add_argument(
        "--all", action="store_true", help="every record on the wire (with --out: one file each)"
    )
    schema.add_argument("--out", type=Path, help="write to this file (with --all: directory)")


async def cmd_schema(args: argparse.Namespace) -> int:
    if args.all:
        if args.name:
            raise UsageError("give a record NAME or --all, not both")
        schemas = all_schemas()
        if args.out is None:
            print(json.dumps(schemas, indent=2, ensure_ascii=False))
            return 0
        await asyncio.to_thread(_write_all, args.out, schemas)
        print(f"wrote {len(schemas)} schemas to {args.out}")
        return 0
    name = args.name or "envelope"
    if name not in RECORDS:
        raise UsageError(f"no record {name!r}; one of: {', '.join(RECORDS)}")
    text = render(json_schema(name))
    if args.out is None:
        print(text, end="")
    else:
        await asyncio.to_thread(args.out.write_text, text)
    return 0


def _write_all(directory: Path, schemas: dict[str, dict[str, object]]) -> None:
    for relative, schema in schemas.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(schema))
