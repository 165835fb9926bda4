"""What agents and callers write reaches an operator's terminal shown, never obeyed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.cli.terminal import one_line, shown
from tests.cli.conftest import reach_argv, run, started_until

# The window title, the clipboard (OSC 52), a carriage return and an erase drawing a forged
# row, hidden text, a C1 CSI, a bell and a bidi override.
EVIL = (
    "\x1b]0;PWNED\x07\x1b]52;c;cm0gLXJmIH4K\x07\r\x1b[2Kbob  ONLINE  all good"
    "\x1b[8m hidden \x1b[0m\x9b31m\u202e"
)
OBEYED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


def test_controls_are_escaped_and_the_rest_kept():
    assert shown("a\x1b[31mb\r\n\tc\x9bd\u202ee é 中") == (
        "a\\u001b[31mb\\u000d\n\tc\\u009bd\\u202ee é 中"
    )
    assert one_line("two\nlines\tand a tab") == "two\\u000alines\\u0009and a tab"
    # A JSON view stays JSON, meaning the same.
    assert json.loads(shown(json.dumps({"k": EVIL}, ensure_ascii=False))) == {"k": EVIL}


def liar() -> Agent:
    agent = Agent("cli-liar", tags={"role": EVIL, "note": "x\nforged  ONLINE"}, startup_delay=0)

    @agent.handler("lies", max_attempts=1)
    async def lies(ctx: TaskContext, payload: dict) -> dict:
        await ctx.progress("note " + EVIL)
        raise RuntimeError("failed " + EVIL)

    return agent


async def test_an_agents_control_characters_are_shown_escaped(broker, coordinator, watcher):
    """`reach agents`, `trace`, `dlq list` and `dlq show` printed an agent's escape sequences
    raw: one set the operator's window title, wrote the clipboard and drew a forged row
    over its own (security re-test)."""
    async with liar().running(broker=broker), ReachClient(broker=broker) as client:
        await watcher.state("cli-liar", "ONLINE")
        message_id, _ = await client.publish("lies", {}, message_id="lies-1")
        await watcher.dead_letter("retries_exhausted", message_id=message_id)
        for command in [
            ("agents",),
            ("agents", "show", "cli-liar"),
            ("trace", message_id),
            ("dlq", "list"),
            ("dlq", "show", message_id),
        ]:
            said = await run(*reach_argv(broker, *command))
            assert said.returncode == 0, said.stderr
            output = said.stdout + said.stderr
            assert not OBEYED.search(output), (command, ascii(output))
            assert "\\u001b]52;c;cm0gLXJmIH4K" in output, (command, output)
            # A line break in a tag starts no line of its own.
            assert not any(line.startswith("forged") for line in output.splitlines()), command
        listed = await run(*reach_argv(broker, "agents"))
        # The tag's row is one line: nothing in it starts another.
        rows = [line for line in listed.stdout.splitlines() if "ONLINE" in line]
        assert len(rows) == 1 and rows[0].startswith("cli-liar"), rows
        shown_letter = await run(*reach_argv(broker, "dlq", "show", message_id))
        letter = json.loads(shown_letter.stdout)  # escaped, the JSON view says the same
        assert letter["error"]["message"].endswith("failed " + EVIL)


async def test_a_subject_token_a_caller_chose_is_escaped_in_console_log_lines(broker):
    """A subject token may hold any byte but whitespace: a caller's own intake subject,
    logged by `reach coordinator` on a terminal (console lines), set the operator's window
    title, wrote the clipboard and erased the line above (security re-test)."""
    topic = "t\x1b]52;c;cm0gLXJmIH4K\x07\x1b[1A\x1b[2K\x9b31m"
    argv = reach_argv(broker, "coordinator", "--metrics-port", "0")[:-2]  # not JSON lines
    process = await started_until(
        *argv, "--log-format", "console", said=b"coordinator serving", env={**os.environ}
    )
    assert process.stderr is not None
    try:
        await broker.publish(broker.names.task(topic), b"{oops", headers={"Nats-Msg-Id": "e-1"})
        async with asyncio.timeout(20):
            while b"invalid envelope" not in (line := await process.stderr.readline()):
                assert line, "the coordinator exited"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 20)
    said = line.decode()
    assert not OBEYED.search(said), ascii(said)
    assert "t\\u001b]52;c;cm0gLXJmIH4K\\u0007" in said, said
