"""The `reach` command line, run as a user runs it: a separate process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentreach.agents import Agent, ReachClient, TaskContext
from agentreach.broker import EmbeddedServer, Topology, provision
from agentreach.broker.dead_letters import dead_letter
from agentreach.broker.embedded import PID_FILE
from agentreach.broker.limits import StorageLimits
from agentreach.broker.ports import free_ports
from agentreach.envelopes import BreakerRecord, Task, now_ms
from tests.cli.conftest import reach_argv, reach_command, run, started_until
from tests.support import wait_for_card


def worker() -> Agent:
    agent = Agent("cli-reach-worker", tags={"role": "worker"}, startup_delay=0)

    @agent.handler("count", capacity=2)
    async def count(ctx: TaskContext, payload: dict) -> dict:
        return {"n": len(payload["items"])}

    return agent


async def reach(broker, *args: str):
    return await run(*reach_argv(broker, *args))


@pytest.mark.parametrize(
    "command",
    [("agents", "show"), ("trace",), ("dlq", "show"), ("workflows", "show"), ("manual", "show")],
)
@pytest.mark.parametrize("bad", ["*", ">", "a.b", "bad id!"])
async def test_an_id_no_message_or_agent_can_have_is_refused_before_connecting(command, bad):
    """A wildcard matched other ids' records (`agents show '*'` listed every agent's running
    tasks as one agent's); `trace '*'` failed with nats-py's bare InvalidKeyError."""
    refused = await run(reach_command(), *command, bad, "--nats-url", "nats://127.0.0.1:1")
    assert refused.returncode == 2, refused.stdout
    assert f"argument id: {bad!r} cannot be an id: ids are 1-128 letters" in refused.stderr


@pytest.mark.parametrize("command", [("up",), ("dlq", "list"), ("publish", "notify", "{}")])
async def test_a_prefix_that_is_not_one_name_token_is_refused_before_connecting(command):
    """`reach up --prefix a.b` ended in a traceback (`invalid stream name: 'A.B_TASKS'`),
    `reach publish --prefix 'A B'` in a bare `BadSubjectError`."""
    for bad in ("a.b", "A B"):
        argv = (*command, "--prefix", bad, "--nats-url", "nats://127.0.0.1:1")
        if command == ("up",):
            argv = (*command, "--prefix", bad, "--port", "1")
        refused = await run(reach_command(), *argv)
        assert refused.returncode == 2, refused.stderr
        said = f"argument --prefix: prefix {bad!r} is not one name token: 1 to 32 letters"
        assert said in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize(
    "argv", [("publish", "a.b", "{}"), ("dlq", "replay", "some-id", "--to-topic", "a.b")]
)
async def test_a_topic_that_is_not_one_token_is_refused_before_connecting(argv):
    """`dlq replay --to-topic a.b` marked the letter replayed (a replay spent) and exited 0;
    the replay, sent on topic `a`, was dead-lettered as `invalid_envelope`."""
    refused = await run(reach_command(), *argv, "--nats-url", "nats://127.0.0.1:1")
    assert refused.returncode == 2, refused.stderr
    assert "'a.b' cannot be a topic: topics are 1-128 letters" in refused.stderr


@pytest.mark.parametrize("delay", ["-5", "nan", "soon"])
async def test_a_startup_delay_below_zero_or_not_a_number_is_refused(delay):
    """`reach agent … --startup-delay -5` was taken (its log said `delay_s: -4.5`)."""
    refused = await run(reach_command(), "agent", "x:y", "--startup-delay", delay)
    assert refused.returncode == 2 and "argument --startup-delay" in refused.stderr


async def test_publish_then_trace_shows_the_lifecycle(broker, coordinator, watcher):
    """`reach publish` returns ids; `reach trace` prints routed, accepted, completed in order."""
    async with worker().running(broker=broker):
        published = await reach(
            broker, "publish", "count", '{"items": [1, 2]}', "--trace-id", "cli-trace"
        )
        assert published.returncode == 0, published.stderr
        ids = json.loads(published.stdout)
        await watcher.event("completed", message_id=ids["message_id"])
    traced = await reach(broker, "trace", "cli-trace")
    assert traced.returncode == 0, traced.stderr
    lines = traced.stdout.splitlines()
    assert lines[0] == "trace cli-trace · 1 message(s)"
    kinds = [line.split()[2] for line in lines[2:]]
    assert kinds == ["received", "routed", "accepted", "completed"]
    assert '{"n": 2}' in lines[-1]
    assert "grant" not in traced.stdout  # a secured dispatch's proof is not for people


async def test_a_trace_named_like_an_agent_shows_no_events_of_that_agent(
    broker, coordinator, watcher
):
    """An agent's own events (liveness) carry its id as their trace id: a trace of that
    name shows its messages only."""
    async with worker().running(broker=broker):
        await watcher.state("cli-reach-worker", "ONLINE")
        published = await reach(
            broker, "publish", "count", '{"items": [1]}', "--trace-id", "cli-reach-worker"
        )
        await watcher.event("completed", message_id=json.loads(published.stdout)["message_id"])
    traced = await reach(broker, "trace", "cli-reach-worker")
    assert traced.stdout.splitlines()[0] == "trace cli-reach-worker · 1 message(s)"
    assert "_agent" not in traced.stdout and "agent_state" not in traced.stdout


async def test_publish_wait_prints_the_result(broker, coordinator):
    """`reach publish --wait` prints the handler's result, and on stderr who accepted which
    message (an operator's Ctrl-C during the wait then still knows what to follow)."""
    async with worker().running(broker=broker):
        done = await reach(
            broker, "publish", "count", '{"items": [1, 2, 3]}', "--wait", "--message-id", "m-1"
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"n": 3}
    assert "accepted by cli-reach-worker, " in done.stderr
    assert "(message m-1)" in done.stderr


async def test_publish_takes_a_payload_larger_than_an_argument_from_a_file_or_stdin(
    broker, coordinator, tmp_path
):
    """A shell caps one argument at 128 KiB: `@FILE` and `-` carry a larger payload."""
    items = list(range(40_000))  # about 230 KB of JSON
    payload = tmp_path / "items.json"
    payload.write_text(json.dumps({"items": items}))
    async with worker().running(broker=broker):
        from_file = await reach(broker, "publish", "count", f"@{payload}", "--wait")
        argv = reach_argv(broker, "publish", "count", "-", "--wait")
        with payload.open() as stdin:
            piped = await asyncio.create_subprocess_exec(
                *map(str, argv), stdin=stdin, stdout=asyncio.subprocess.PIPE
            )
            out, _ = await asyncio.wait_for(piped.communicate(), 30)
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout) == {"n": 40_000}
    assert piped.returncode == 0
    assert json.loads(out) == {"n": 40_000}
    missing = await reach(broker, "publish", "count", f"@{tmp_path / 'nowhere.json'}")
    assert missing.returncode == 1
    assert "cannot read the JSON file" in missing.stderr


async def test_provision_twice_reports_unchanged(broker):
    """`reach provision` is idempotent: the second run changes nothing; it says what auto
    resolved to, and each stream's replicas (one on a single server)."""
    done = await reach(broker, "provision")
    assert done.returncode == 0, done.stderr
    head, *rows = done.stdout.splitlines()
    outcomes = {row.split()[0]: row.split()[1:3] for row in rows}
    assert head.startswith("replicas: auto → 1;")
    assert {tuple(v) for v in outcomes.values()} == {("unchanged", "R1")}
    assert broker.names.dlq_stream in outcomes


async def test_provision_without_a_config_keeps_the_limits_a_config_set(broker, tmp_path):
    """A bare `reach provision` (run to look) keeps the limits a coordinator's config set,
    and says so: it lifted them cluster-wide. With a config it applies that config's, and
    says what each limit was and is."""
    names = broker.names
    limits = StorageLimits(tasks_bytes=65_536, tasks_per_subject=7)
    await provision(broker, Topology.default(names, limits=limits))
    looked = await reach(broker, "provision")
    assert looked.returncode == 0, looked.stderr
    assert "limits: kept as they are (no --config" in looked.stderr
    tasks = await broker.js.stream_info(names.tasks_stream)
    assert (tasks.config.max_bytes, tasks.config.max_msgs_per_subject) == (65_536, 7)
    config = tmp_path / "coordinator.yaml"
    config.write_text("limits: {tasks_per_subject: 9}\n")
    applied = await reach(broker, "provision", "--config", str(config))
    assert applied.returncode == 0, applied.stderr
    tasks = await broker.js.stream_info(names.tasks_stream)
    assert (tasks.config.max_bytes, tasks.config.max_msgs_per_subject) == (-1, 9)
    assert "limits: kept" not in applied.stderr
    assert '"max_bytes": [65536, "unlimited"]' in applied.stderr


async def test_publish_wait_that_hears_no_ack_says_the_task_may_still_run(
    broker, coordinator, watcher
):
    """No ack within --ack-ms does not end the task: the error says how to follow it and
    to wait again under the same id, before an operator runs it twice under a new one."""
    gate = asyncio.Event()
    agent = Agent("cli-busy", startup_delay=0)

    @agent.handler("busy", capacity=1)
    async def busy(ctx: TaskContext, payload: dict) -> dict:
        await gate.wait()
        return payload

    async with agent.running(broker=broker):
        await reach(broker, "publish", "busy", '{"n": 1}')
        await watcher.event("accepted", topic="busy")
        waited = await reach(
            broker,
            "publish",
            "busy",
            '{"n": 2}',
            "--wait",
            "--ack-ms",
            "500",
            "--message-id",
            "busy-2",
        )
        gate.set()
        await watcher.event("completed", message_id="busy-2")
    assert waited.returncode == 3  # the outcome is unknown, not a failure
    assert "no agent acknowledged 'busy' within 500 ms" in waited.stderr
    assert "busy-2 may still run" in waited.stderr and "--message-id busy-2" in waited.stderr
    assert waited.stderr.count("may still run") == 1, waited.stderr  # said twice in one line
    assert "invoke again" not in waited.stderr  # the advice is the command's, said once


async def test_agents_and_dlq_commands(broker, coordinator, watcher):
    """`reach agents` lists cards; `reach dlq list|show` shows dead letters."""
    async with worker().running(broker=broker):
        agents = await reach(broker, "agents")
        await reach(broker, "publish", "nobody_serves_this", "{}", "--message-id", "lost-1")
        await watcher.dead_letter("no_route")
        scripted = await reach(broker, "agents", "--json")
    row = next(line for line in agents.stdout.splitlines() if line.startswith("cli-reach-worker"))
    assert row.split()[1] in ("ONLINE", "UNKNOWN")
    assert "count@1" in row
    [agent] = [json.loads(line) for line in scripted.stdout.splitlines()]  # one per line
    assert (agent["agent_id"], agent["intents"]) == ("cli-reach-worker", {"count": "1"})
    assert agent["state"] in ("ONLINE", "UNKNOWN") and agent["quarantined"] is False
    await watcher.state("cli-reach-worker", "OFFLINE")  # the verdict of a clean stop
    stopped = await reach(broker, "agents")
    row = next(line for line in stopped.stdout.splitlines() if line.startswith("cli-reach-worker"))
    assert row.split()[1] == "STOPPED"  # as `reach top` and the metrics say
    listed = await reach(broker, "dlq", "list")
    assert "lost-1" in listed.stdout and "no_route" in listed.stdout
    [listed_json] = [
        json.loads(line)
        for line in (await reach(broker, "dlq", "list", "--json")).stdout.splitlines()
    ]
    assert (listed_json["message_id"], listed_json["state"]) == ("lost-1", "open")
    assert listed_json["reason"] == "no_route" and listed_json["at_ms"] > 0
    shown = await reach(broker, "dlq", "show", "lost-1")
    letter = json.loads(shown.stdout)
    assert letter["reason"] == "no_route"
    assert letter["envelope"]["topic"] == "nobody_serves_this"
    assert (letter["letter_state"], letter["settled_by"]) == ("open", [])
    stats = await reach(broker, "dlq", "stats")
    assert stats.stdout.split()[:4] == ["REASON", "TOPIC", "LETTERS", "OPEN"]
    assert stats.stdout.splitlines()[1].split() == ["no_route", "nobody_serves_this", "1", "1"]
    resolved = await reach(broker, "dlq", "resolve", "lost-1", "--note", "told the caller")
    assert resolved.returncode == 0, resolved.stderr
    shown = json.loads((await reach(broker, "dlq", "show", "lost-1")).stdout)
    assert shown["letter_state"] == "resolved"
    [settling] = shown["settled_by"]
    assert (settling["event"], settling["note"]) == ("resolved", "told the caller")
    assert settling["by"] and settling["at_ms"] > 0
    stats = await reach(broker, "dlq", "stats")
    assert stats.stdout.splitlines()[-1].split() == ["total", "1", "0"]


async def test_dlq_commands_skip_what_is_not_a_dead_letter(broker, coordinator, watcher):
    """A stray publish on the dead-letter stream is named on stderr, not fatal."""
    await broker.publish(broker.names.dlq("rejected", "junk"), b'{"not": "a letter"}')
    await reach(broker, "publish", "nobody_serves_this", "{}", "--message-id", "lost-3")
    await watcher.dead_letter("no_route")
    for action in ("list", "stats"):
        done = await reach(broker, "dlq", action)
        assert done.returncode == 0, done.stderr
        assert "not a dead letter" in done.stderr and "reach.dlq.rejected.junk" in done.stderr
    listed = await reach(broker, "dlq", "list")
    assert "lost-3" in listed.stdout
    shown = await reach(broker, "dlq", "show", "lost-3")
    assert json.loads(shown.stdout)["reason"] == "no_route"


async def test_dlq_and_agents_refuse_what_they_would_ignore(broker, coordinator, watcher):
    """A filter nothing matches says which reasons and topics there are (a typo shows); an
    id where none is taken is refused, not ignored."""
    await reach(broker, "publish", "nobody_serves_this", "{}", "--message-id", "lost-4")
    await watcher.dead_letter("no_route", message_id="lost-4")
    bogus = await reach(broker, "dlq", "list", "--reason", "bogus")
    extra = await reach(broker, "dlq", "stats", "lost-4")
    listed = await reach(broker, "agents", "list", "cli-reach-worker")
    misplaced = await reach(broker, "dlq", "stats", "--json")
    resolved = await reach(broker, "dlq", "resolve", "--open", "--reason", "bogus", "--note", "x")
    assert bogus.returncode == 0 and bogus.stdout.strip() == "no dead letters with reason 'bogus'"
    # It said "0 open letter(s) resolved" and exited 0 (a fresh operator's typo went unseen).
    assert resolved.returncode == 1, resolved.stdout
    assert resolved.stdout.strip() == "no dead letters with reason 'bogus'"
    assert "the reasons there are: no_route 1" in resolved.stderr
    assert "the reasons there are: no_route 1" in bogus.stderr
    assert "the topics there are: nobody_serves_this 1" in bogus.stderr
    assert extra.returncode == 1 and "reach dlq show lost-4" in extra.stderr
    assert listed.returncode == 1 and "takes no agent id (got 'cli-reach-worker')" in listed.stderr
    assert misplaced.returncode == 1 and "--json is for dlq list" in misplaced.stderr


def test_reach_up_refuses_embedded_server_options_with_a_server_of_ones_own(tmp_path):
    """--port with $NATS_URL set would be ignored (reach up used the URL's server and waited
    for it): refused, naming both."""
    env = {**os.environ, "NATS_URL": "nats://127.0.0.1:1"}
    done = subprocess.run(
        [str(reach_command()), "up", "--port", "24999", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "--port and --data-dir set up the embedded nats-server, but $NATS_URL" in done.stderr


async def test_dlq_replay_sends_the_task_again(broker, coordinator, watcher):
    """`reach dlq replay ID --to-topic T` republishes a dead letter, which then completes; a
    second replay of it is refused, naming the first, unless forced."""
    await reach(broker, "publish", "nobody_serves_this", '{"items": [1]}', "--message-id", "lost-2")
    await watcher.dead_letter("no_route", message_id="lost-2")
    async with worker().running(broker=broker):
        replayed = await reach(broker, "dlq", "replay", "lost-2", "--to-topic", "count")
        assert replayed.returncode == 0, replayed.stderr
        new_id = json.loads(replayed.stdout)["message_id"]
        completed = await watcher.event("completed", message_id=new_id)
        traced = await reach(broker, "trace", "lost-2")
        again = await reach(broker, "dlq", "replay", "lost-2", "--to-topic", "count")
        forced = await reach(broker, "dlq", "replay", "lost-2", "--to-topic", "count", "--force")
        listed = await reach(broker, "dlq", "list")
    assert completed.detail["result"] == {"n": 1}
    # The letter's message and its replay; the `replayed` event was a third message of
    # nobody's, under the letter's id (an outside trial).
    assert "· 2 message(s)" in traced.stdout.splitlines()[0], traced.stdout
    assert "bare subject" not in traced.stdout
    assert again.returncode == 1
    refusal = "lost-2 (no_route, topic nobody_serves_this) not replayed: it is replayed"
    assert refusal in again.stderr
    assert f"(as {new_id}); --force replays it anyway" in again.stderr
    assert forced.returncode == 0, forced.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["MESSAGE_ID", "AT", "REASON", "TOPIC", "STATE", "ERROR"]
    assert row.split()[:1] + row.split()[2:5] == [
        "lost-2",
        "no_route",
        "nobody_serves_this",
        "replayed",
    ]
    missing = await reach(broker, "dlq", "replay", "never-was")
    assert (
        missing.returncode == 1 and "no dead letter with message_id 'never-was'" in missing.stderr
    )


async def test_dlq_replay_with_a_payload_sends_the_task_with_it(broker, coordinator, watcher):
    """`reach dlq replay ID --payload JSON` sends the task with that payload instead of its
    own (a fix of what it was sent with); JSON that is not is named, and nothing is sent."""
    await reach(broker, "publish", "nobody_serves_this", '{"items": [1]}', "--message-id", "lost-3")
    await watcher.dead_letter("no_route", message_id="lost-3")
    bad = await reach(broker, "dlq", "replay", "lost-3", "--payload", '{"items": ')
    assert bad.returncode != 0 and "--payload is not valid JSON" in bad.stderr
    # Said before the letter is looked for: of no letter, "no dead letter" hid it (a re-trial).
    none = await reach(broker, "dlq", "replay", "never-was", "--payload", '{"items": ')
    assert none.returncode != 0 and "--payload is not valid JSON" in none.stderr
    async with worker().running(broker=broker):
        fix = ("--to-topic", "count", "--payload", '{"items": [1, 2, 3]}')
        replayed = await reach(broker, "dlq", "replay", "lost-3", *fix)
        assert replayed.returncode == 0, replayed.stderr
        completed = await watcher.event(
            "completed", message_id=json.loads(replayed.stdout)["message_id"]
        )
    assert completed.detail["result"] == {"n": 3}


async def test_schema_is_json_schema_of_every_kind():
    """`reach schema` prints a JSON Schema naming every envelope kind."""
    done = await run(reach_command(), "schema")
    schema = json.loads(done.stdout)
    assert {"Task", "Ack", "Progress", "Result", "ErrorReply", "Event", "DeadLetter"} <= set(
        schema["$defs"]
    )


async def test_schema_all_writes_the_committed_schemas(tmp_path):
    """`reach schema --all --out DIR` writes every record's schema, as committed in schemas/;
    an unknown record name is one line and exit 1."""
    done = await run(reach_command(), "schema", "--all", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    committed = Path(__file__).parents[2] / "schemas"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.json"))
    assert written == sorted(str(p.relative_to(committed)) for p in committed.rglob("*.json"))
    assert (tmp_path / "events" / "failed.json").read_text() == (
        committed / "events" / "failed.json"
    ).read_text()
    unknown = await run(reach_command(), "schema", "nope")
    assert unknown.returncode == 1 and "no record 'nope'" in unknown.stderr
    assert "Traceback" not in unknown.stderr


async def test_user_mistakes_are_one_line_without_traceback(broker):
    """Unreachable server, bad JSON and a bad agent target: one clear line, exit 1."""
    unreachable = await run(reach_command(), "trace", "x", "--nats-url", "nats://127.0.0.1:1")
    bad_json = await reach(broker, "publish", "count", "{nope")
    bad_target = await reach(broker, "agent", "no_such_module:agent")
    no_object = await reach(broker, "agent", "agentreach.examples.summarize:nosuch")
    too_long = await reach(broker, "publish", "count", "{}", "--ttl-ms", "999999999999")
    for done, expected in [
        (unreachable, "cannot connect to NATS at nats://127.0.0.1:1"),
        (bad_json, "the PAYLOAD argument is not valid JSON"),
        (bad_target, "cannot import 'no_such_module'"),
        (no_object, "module 'agentreach.examples.summarize' has no 'nosuch'"),
        (too_long, "--ttl-ms takes a number of ms from 1 to 86400000 (a day)"),
    ]:
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("reach: error: ")
        assert expected in done.stderr


async def test_an_abbreviated_option_is_refused_not_guessed():
    """`--ttl 5` is not taken for `--ttl-ms 5` (a task that expires at once)."""
    done = await run(reach_command(), "publish", "summarize", "{}", "--ttl", "5")
    assert done.returncode == 2
    assert "unrecognized arguments: --ttl 5" in done.stderr


async def test_a_command_line_mistake_is_one_line_naming_it_and_the_command():
    """No usage block: the mistake, by the command that has it, and where its help is."""
    for argv, said in [
        (("trace", "a", "b"), "reach trace: error: unrecognized arguments: b"),
        (("publish", "t", "{}", "--priority", "P9"), "reach publish: error: argument --priority"),
        (("nosuch",), "reach: error: argument COMMAND: invalid choice: 'nosuch'"),
        (  # found by the command, not by argparse: exit 1 before (a trial)
            ("workflows", "show", "ya-1", "extra", "--nats-url", "nats://127.0.0.1:1"),
            "reach workflows: error: workflows show takes no argument after the id",
        ),
        (
            ("--nats-url", "nats://127.0.0.1:1", "agents"),
            "reach: error: options come after the command: reach COMMAND --nats-url",
        ),
    ]:
        done = await run(reach_command(), *argv)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(said), done.stderr
        assert done.stderr.rstrip().endswith("--help`)")


async def test_output_into_a_closed_pipe_ends_without_a_traceback():
    """`reach … | head`: the reader goes away, and `reach` stops quietly, whether the output
    is written while it runs (a large one) or only when it exits (a short one, buffered)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for argv in (("schema", "--all"), ("schema", "trace_request")):
        reading, writing = os.pipe()
        os.close(reading)  # nobody reads: the first write fails
        try:
            process = await asyncio.create_subprocess_exec(
                reach_command(), *argv, stdout=writing, stderr=asyncio.subprocess.PIPE, env=env
            )
        finally:
            os.close(writing)
        _, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 1, argv
        assert b"Traceback" not in err and b"BrokenPipeError" not in err, argv


async def test_up_on_a_taken_port_is_one_clear_line(tmp_path):
    """`reach up --port N` with N taken says so in one line."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = await run(
            reach_command(),
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "nats"),
            env={"NATS_URL": ""},
        )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"reach: error: port {port} on 127.0.0.1 is already in use: stop what holds it,"
        " choose another with --port, or pass --nats-url to use that server"
    )


async def test_up_serves_with_embedded_server_and_stops_on_ctrl_c(tmp_path):
    """`reach up` starts nats-server and the coordinator, and exits 0 on SIGINT."""
    process = await asyncio.create_subprocess_exec(
        reach_command(),
        "up",
        "--port",
        "-1",
        "--data-dir",
        str(tmp_path / "nats"),
        "--log-format",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NATS_URL": ""},
    )
    assert process.stderr is not None
    said: list[bytes] = []
    async with asyncio.timeout(60):  # a bound for a hang: CI runs two suites at once
        while b"coordinator serving on" not in (line := await process.stderr.readline()):
            assert line, "reach up exited before serving"
            said.append(line)
    assert any(b"development server: no authentication, loopback only" in s for s in said)
    url = line.decode().split("serving on ")[1].split()[0].rstrip(";")
    process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(process.wait(), 20) == 0
    assert b"coordinator stopped" in await process.stderr.read()  # not "stopping" alone
    assert (tmp_path / "nats" / "jetstream").is_dir()
    refused = await run(reach_command(), "agents", "--nats-url", url)
    assert "cannot connect" in refused.stderr  # the embedded server stopped with it


async def test_up_starts_its_nats_server_again_when_it_ends(tmp_path):
    """`reach up`'s embedded nats-server killed with `kill -9`: reach up says so, starts it
    again on its port and store (here 0.2 s later), and the coordinator serves on; Ctrl-C
    stops the new one too."""
    store = tmp_path / "nats"
    command = ("up", "--port", "-1", "--data-dir", store, "--restart-after", "0.2")
    env = {**os.environ, "NATS_URL": ""}
    process = await started_until(
        reach_command(), *command, "--log-format", "json", said=b"coordinator serving on", env=env
    )
    assert process.stderr is not None
    try:
        killed = int((store / PID_FILE).read_text())
        os.kill(killed, signal.SIGKILL)
        said: list[bytes] = []
        async with asyncio.timeout(30):
            while b"nats-server started again" not in (line := await process.stderr.readline()):
                assert line, "reach up exited"
                said.append(line)
        restarted = int((store / PID_FILE).read_text())
    finally:
        os.killpg(process.pid, signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), 30)
    [ended] = [s for s in said if b"nats-server ended; starting it again" in s]
    assert b"killed by SIGKILL" in ended
    assert restarted != killed and code == 0
    with pytest.raises(ProcessLookupError):  # stopped with reach up
        os.kill(restarted, 0)


async def test_a_store_in_use_is_refused_in_one_line(tmp_path):
    """A second server (a demo beside `reach up`) on the same store is refused, not let in
    to corrupt it; the demo's own store is elsewhere by default."""
    async with EmbeddedServer(port=-1, store_dir=tmp_path / "nats"):
        done = await run(
            reach_command(),
            "up",
            "--port",
            "-1",
            "--data-dir",
            str(tmp_path / "nats"),
            env={"NATS_URL": ""},
        )
    assert done.returncode == 1
    assert "is in use by process" in done.stderr and "Traceback" not in done.stderr
    assert "default ./.reach/demo/nats" in (await run(reach_command(), "demo", "--help")).stdout


async def test_agents_watch_refuses_a_period_below_half_a_second(broker):
    """`reach agents --watch 0` (or -1) is a usage error, not a loop hammering the server."""
    for period in ("0", "-1"):
        done = await reach(broker, "agents", "--watch", period)
        assert done.returncode == 1
        assert "--watch takes seconds between redraws, at least 0.5" in done.stderr


async def test_demo_runs_and_exits_cleanly(tmp_path):
    """`reach demo` prints results and traces, then exits 0."""
    done = await run(
        reach_command(),
        "demo",
        "--data-dir",
        str(tmp_path / "nats"),
        "--log-level",
        "warning",
        env={"NATS_URL": ""},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"REACH EVERY AGENT"' in done.stdout
    assert "Rejected: no_route" in done.stdout
    assert done.stdout.count("completed") >= 3
    assert '"NATS MOVES MESSAGES BETWEEN AGENTS."' in done.stdout  # the headline workflow
    assert "workflow headline " in done.stdout and "└─ headline" in done.stdout


async def test_agents_clear_needs_a_coordinator_and_a_known_agent(broker, coordinator):
    """`reach agents clear ID` answers for a known agent and refuses an unknown one; it lifts
    a quarantine (and says so only when there was one), and says that an isolation (a
    breaker) stays until a trial succeeds."""
    async with worker().running(broker=broker):
        await wait_for_card(broker, "cli-reach-worker", status="running")
        async with asyncio.timeout(10):
            while "cli-reach-worker" not in coordinator.liveness.agents:  # noqa: ASYNC110
                await asyncio.sleep(0.02)  # the monitor's in-memory view has no event
        breakers = await broker.bucket(broker.names.breakers_bucket, BreakerRecord)
        isolation = BreakerRecord(
            agent_id="cli-reach-worker",
            state="open",
            reason="test",
            open_until_ms=now_ms() + 60_000,
        )
        await breakers.put(isolation.key, isolation)
        not_quarantined = await reach(broker, "agents", "clear", "cli-reach-worker")
        coordinator.liveness.agents["cli-reach-worker"].quarantined = True  # as flapping does
        cleared = await reach(broker, "agents", "clear", "cli-reach-worker")
    unknown = await reach(broker, "agents", "clear", "nobody")
    assert not_quarantined.returncode == 0, not_quarantined.stderr
    assert not_quarantined.stdout.splitlines()[0] == "cli-reach-worker: not quarantined"
    assert cleared.returncode == 0, cleared.stderr
    lifted, kept = cleared.stdout.splitlines()
    assert lifted == "cli-reach-worker: quarantine lifted"
    assert "its breakers are not cleared (ISOLATED:open)" in kept
    assert not coordinator.liveness.agents["cli-reach-worker"].quarantined
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.strip() == "reach: error: nobody: unknown agent"


@pytest.mark.parametrize(
    ("command", "heading"),
    [(("agents", "--watch", "0.5"), b"AGENT"), (("top", "--interval", "0.5"), b"Agent-Reach ")],
    ids=["agents-watch", "top"],
)
async def test_redraws_until_ctrl_c(broker, coordinator, command, heading):
    """`reach agents --watch` and `reach top` redraw until interrupted, and Ctrl-C ends them."""
    async with worker().running(broker=broker):
        process = await asyncio.create_subprocess_exec(
            *reach_argv(broker, *command),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert process.stdout is not None
        drawn = b""
        try:
            # A bound for a hang, not a speed: a loaded machine (CI runs two suites at once)
            # takes seconds to start a Python process.
            async with asyncio.timeout(60):
                while drawn.count(heading) < 2:
                    chunk = await process.stdout.read(4096)
                    assert chunk, f"reach {command[0]} ended: {drawn!r}"
                    drawn += chunk
        except BaseException:
            process.kill()  # not left running into the next test
            await process.wait()
            raise
        process.send_signal(signal.SIGINT)
        # Read on to the end: a full pipe blocks its print, and with it the Ctrl-C handler
        # (a server shared by many tests has a long table).
        await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 130
    assert b"cli-reach-worker" in drawn
    assert b"\x1b[2J" not in drawn  # a pipe gets each table after the last, no screen codes


ROUTES = """
routing:
  rules:
    - name: counting
      match: {topic: count}
      to: {tags: "role=worker"}
    - {name: fallback, fallback: true, to: {dlq: no_route}}
"""


async def test_routes_check_and_reload(broker, start_coordinator, tmp_path):
    """`reach routes check FILE` validates offline; `reach routes reload` makes every
    replica re-read its file and says which did; a bad file is one clear line."""
    from agentreach.coordinator import CoordinatorConfig

    path = tmp_path / "coordinator.yaml"
    path.write_text(ROUTES)
    checked = await reach(broker, "routes", "check", str(path))
    assert checked.returncode == 0, checked.stderr
    assert "2 rules, fallback 'fallback'" in checked.stdout
    nobody = await reach(broker, "routes", "reload", "--wait", "0.3")
    assert nobody.returncode != 0 and "no coordinator is running" in nobody.stderr
    async with (
        start_coordinator(CoordinatorConfig(), path),
        start_coordinator(CoordinatorConfig(), path) as second,
    ):
        reloaded = await reach(broker, "routes", "reload", "--wait", "0.5")
        assert reloaded.returncode == 0, reloaded.stderr
        assert reloaded.stdout.count("reloaded 2 rules: counting, fallback") == 2
        assert [r.name for r in second.router.routing.rules] == ["counting", "fallback"]
        path.write_text(ROUTES.replace("fallback: true, ", ""))
        refused = await reach(broker, "routes", "check", str(path))
        assert refused.returncode != 0
        assert (
            refused.stderr.count("\n") == 1
            and "the last rule must be the fallback" in refused.stderr
        )
        bad = await reach(broker, "routes", "reload", "--wait", "0.5")
        assert bad.returncode == 1 and bad.stdout.count("not reloaded") == 2


async def test_routes_reload_says_what_waits_for_a_restart_and_differing_files(
    broker, start_coordinator, tmp_path
):
    """A file whose other sections changed too: the reload says, per replica, which apply
    at its next start only; replicas reading files that differ are told apart."""
    from agentreach.coordinator import CoordinatorConfig

    mine, theirs = tmp_path / "a.yaml", tmp_path / "b.yaml"
    mine.write_text(ROUTES)
    theirs.write_text(ROUTES)
    async with (
        start_coordinator(CoordinatorConfig(), mine),
        start_coordinator(CoordinatorConfig(), theirs),
    ):
        same = await reach(broker, "routes", "reload", "--wait", "0.5")
        mine.write_text(ROUTES + "delivery: {max_attempts: 5}\n")
        changed = await reach(broker, "routes", "reload", "--wait", "0.5")
    assert same.returncode == 0 and same.stderr == ""
    assert changed.returncode == 0, changed.stderr
    assert changed.stderr.count("changed, applied at its next start only: delivery") == 1
    assert "warning: the replicas read different config files (SHA-256: " in changed.stderr


async def test_trace_shows_the_rule_and_who_was_passed_over(broker, coordinator, watcher):
    """A routed step in `reach trace` names its rule."""
    async with worker().running(broker=broker):
        published = await reach(broker, "publish", "count", '{"items": []}', "--trace-id", "tr-r")
        assert published.returncode == 0, published.stderr
        await watcher.event("completed", message_id=json.loads(published.stdout)["message_id"])
    traced = await reach(broker, "trace", "tr-r")
    routed_line = next(line for line in traced.stdout.splitlines() if " routed " in line)
    assert "rule default: → cli-reach-worker" in routed_line


async def test_the_readme_workflow_walkthrough_runs_as_written(broker, watcher):
    """`reach coordinator --config deploy/coordinator/coordinator.yaml` with the newsroom
    example agent: `article` goes plan → write → review → publish and completes."""
    from pathlib import Path

    from agentreach.examples.newsroom import agent as newsroom

    config = Path(__file__).parents[2] / "deploy" / "coordinator" / "coordinator.yaml"
    argv = reach_argv(broker, "coordinator", "--config", str(config), "--metrics-port", "0")
    process = await asyncio.create_subprocess_exec(
        *map(str, argv), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        async with newsroom.running(broker=broker):
            await broker.publish(
                broker.names.task("article"),
                b'{"topic": "nats"}',
                headers={"Nats-Msg-Id": "article-1"},
            )
            done = await watcher.event("workflow_completed", message_id="article-1", timeout=30)
        shown = await reach(broker, "workflows", "show", "article-1")
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 20)
    assert done.detail["workflow"] == "article"
    assert shown.returncode == 0, shown.stderr
    steps = [line.split()[1] for line in shown.stdout.splitlines()[1:5]]
    assert steps == ["plan", "write", "review", "publish"]
    assert "completed" in shown.stdout.splitlines()[0]


async def test_workflows_list_counts_done_steps_of_the_whole_workflow(
    broker, start_coordinator, watcher
):
    """DONE is the steps completed of the workflow's steps: a two-step chain failed at its
    first is 0/2 and a fan-out failed in a branch 1/3 (branches and join), not of the steps
    started; a state machine's, of the states it entered."""
    from agentreach.agents import PermanentError
    from agentreach.coordinator import workflow as wf
    from tests.e2e.routing_support import fast, serving

    agent = Agent("cli-steps", startup_delay=0)

    @agent.handler("good")
    async def good(ctx: TaskContext, payload: dict) -> dict:
        return {"ok": True}

    @agent.handler("bad")
    async def bad(ctx: TaskContext, payload: dict) -> dict:
        raise PermanentError("refused")

    flows = {
        "pair": wf.chain(wf.step("first", "bad"), wf.step("second", "good")),
        "split": wf.fanout([wf.step("l", "bad"), wf.step("r", "good")], then=wf.step("j", "good")),
        "order": wf.machine(
            "pending",
            {
                "pending": wf.state("good", next=[wf.go("done", when=("ok", "==", True))]),
                "done": wf.state("good", terminal=True),
                "refunded": wf.state("good", terminal=True),
            },
        ),
    }
    async with (
        start_coordinator(fast(workflows=flows)) as coordinator,
        serving(broker, coordinator, agent),
    ):
        failed, completed = "workflow_failed", "workflow_completed"
        ends = {"pair": failed, "split": failed, "order": completed}
        for name, end in ends.items():
            await broker.publish(broker.names.task(name), b"{}", headers={"Nats-Msg-Id": name})
            await watcher.event(end, message_id=name)
        listed = await reach(broker, "workflows", "list")
    assert listed.returncode == 0, listed.stderr
    done = {line.split()[1]: line.split()[4] for line in listed.stdout.splitlines()[1:]}
    assert done == {"pair": "0/2", "split": "1/3", "order": "2/2"}


async def test_every_option_has_help_and_every_command_an_example():
    """`reach --version`, and in `reach COMMAND --help` every option says what it does and
    an example follows."""
    from agentreach.cli.main import parser

    root = parser()
    version = await run(reach_command(), "--version")
    assert version.returncode == 0 and version.stdout.startswith("reach ")
    commands = next(a for a in root._actions if a.dest == "command" or a.choices)
    for name, sub in commands.choices.items():
        assert sub.epilog and sub.epilog.startswith("example"), name
        for action in sub._actions:
            assert action.help, f"reach {name}: {action.option_strings or action.dest} has no help"
    completion = await run(reach_command(), "completion", "bash")
    assert "complete -o default -F _reach reach" in completion.stdout
    assert "--metrics-port" in completion.stdout and "dashboard" in completion.stdout


async def test_reach_top_once_prints_the_essentials(broker, coordinator):
    """`reach top --once`: the five metrics, the coordinators, the agents with LOAD, and how
    many dead letters wait for someone (it said only how many were kept)."""
    task = Task(v=1, message_id="top-open", trace_id="top-open", topic="nobody_serves")
    await dead_letter(broker, reason="no_route", task=task, **_ids(task))
    async with worker().running(broker=broker):
        top = await reach(broker, "top", "--once")
    assert top.returncode == 0, top.stderr
    for shown in ("Success rate", "P99 reach latency", "Isolated agents", "1 coordinator replica"):
        assert shown in top.stdout, top.stdout
    assert "cli-reach-worker" in top.stdout and "LOAD" in top.stdout
    assert "dead letters: 1 kept (no_route 1), 1 open" in top.stdout, top.stdout


def _ids(task: Task) -> dict[str, str]:
    return {"message_id": task.message_id, "trace_id": task.trace_id, "topic": task.topic}


async def test_a_workflow_built_in_python_is_served_by_reach_coordinator(broker, watcher, tmp_path):
    """`reach coordinator --workflows flows:WORKFLOWS` serves workflows built with
    `agentreach.coordinator.workflow`, as the README writes them."""
    (tmp_path / "flows.py").write_text(
        "from agentreach.coordinator import workflow as wf\n"
        "WORKFLOWS = {'twice': wf.chain(wf.step('one', 'count'), wf.step('two', 'count',"
        " input={'items': ['$.one.n']}))}\n"
    )
    argv = reach_argv(
        broker, "coordinator", "--workflows", "flows:WORKFLOWS", "--metrics-port", "-1"
    )
    process = await asyncio.create_subprocess_exec(
        *map(str, argv),
        cwd=tmp_path,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with worker().running(broker=broker):
            await broker.publish(
                broker.names.task("twice"), b'{"items": [1, 2, 3]}', headers={"Nats-Msg-Id": "py-1"}
            )
            done = await watcher.event("workflow_completed", message_id="py-1", timeout=30)
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 20)
    assert done.detail["workflow"] == "twice"
    wrong = await reach(broker, "coordinator", "--workflows", "flows:NOPE")  # not in this cwd
    assert wrong.returncode != 0
    assert wrong.stderr == (
        "reach: error: cannot import 'flows': No module named 'flows' (run from the folder"
        " that holds it, or add that folder to PYTHONPATH)\n"
    )


async def test_a_workflow_module_that_builds_a_bad_definition_is_one_line(broker, tmp_path):
    """A definition the builder refuses as the module is imported, and a module that is not
    Python, are one line each; the module's own bug keeps its traceback."""
    (tmp_path / "bad.py").write_text(
        "from agentreach.coordinator import workflow as wf\nWORKFLOWS = {'w1': wf.chain()}\n"
    )
    (tmp_path / "broken.py").write_text("def broken(:\n")
    (tmp_path / "buggy.py").write_text("raise ValueError('a bug of its own')\n")
    said = {}
    for module in ("bad", "broken", "buggy"):
        argv = reach_argv(broker, "coordinator", "--workflows", f"{module}:WORKFLOWS")
        said[module] = await run(*argv, cwd=tmp_path)
    assert said["bad"].returncode != 0
    assert said["bad"].stderr == (
        "reach: error: 'bad', workflow 'w1' (line 2): a workflow needs at least one step:"
        " 'chain' is empty\n"
    )
    assert said["broken"].stderr.startswith("reach: error: 'broken' is not valid Python:")
    assert said["broken"].stderr.count("\n") == 1
    assert "Traceback" in said["buggy"].stderr and "a bug of its own" in said["buggy"].stderr


async def test_reach_up_refuses_a_bad_workflow_module_before_starting_a_server(tmp_path):
    """`reach up` checks its --workflows before the embedded nats-server starts: the mistake
    is the only line, and no server was started (nor its store made) to be torn down."""
    (tmp_path / "bad.py").write_text(
        "from agentreach.coordinator import workflow as wf\nWORKFLOWS = {'w1': wf.chain()}\n"
    )
    store = tmp_path / "nats"
    argv = (reach_command(), "up", "--port", "-1", "--data-dir", store, "--metrics-port", "-1")
    said = await run(*argv, "--workflows", "bad:WORKFLOWS", cwd=tmp_path)
    assert said.returncode != 0
    assert said.stderr == (
        "reach: error: 'bad', workflow 'w1' (line 2): a workflow needs at least one step:"
        " 'chain' is empty\n"
    )
    assert not store.exists()


async def test_a_second_signal_does_not_cut_an_agents_shutdown_short(broker, coordinator, watcher):
    """A process group killed (two SIGTERMs) or Ctrl-C pressed twice while a task drains:
    the agent ends its shutdown (the task completes, the card says stopped) instead of
    dying with its card left `running`."""
    env = {**os.environ, "PULSE_ID": "draining"}
    process = await asyncio.create_subprocess_exec(
        *reach_argv(broker, "agent", "tests.e2e.pulse:agent"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert process.stderr is not None

    async def line_with(marker: bytes) -> None:
        assert process.stderr is not None
        while marker not in (line := await process.stderr.readline()):
            assert line, f"reach agent exited before printing {marker!r}"

    try:
        async with asyncio.timeout(30):
            await line_with(b"Ctrl-C to stop")  # printed once the signal handlers are in place
            async with ReachClient(broker=broker) as client:
                message_id, _ = await client.publish("burn", {"seconds": 2.0})
            await watcher.event("accepted", message_id=message_id)
            process.send_signal(signal.SIGTERM)
            await line_with(b'"stopping"')
            process.send_signal(signal.SIGTERM)  # while the burn task drains
            await line_with(b"stopping already")
            await wait_for_card(broker, "draining", status="stopped")
            await process.wait()
            await watcher.event("completed", message_id=message_id)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0


async def test_a_coordinator_waiting_for_nats_answers_its_probes():
    """`reach coordinator` started before its server: while it waits, /healthz answers 200
    and /readyz 503 saying why (an orchestrator must not take the wait for a dead process,
    nor send it work)."""
    nats_port, http_port = _free_port(), _free_port()
    url, metrics = f"nats://127.0.0.1:{nats_port}", str(http_port)
    command = ("coordinator", "--nats-url", url, "--metrics-port", metrics, "--log-format", "json")
    process = await started_until(reach_command(), *command, said=b"waiting for NATS")
    try:
        health = await asyncio.to_thread(_get, f"http://127.0.0.1:{http_port}/healthz")
        ready = await asyncio.to_thread(_get, f"http://127.0.0.1:{http_port}/readyz")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)
    assert health == (200, "ok\n")
    assert ready == (503, "not ready: not connected to NATS\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("command", ["agent", "coordinator"])
async def test_a_service_waiting_for_nats_stops_on_a_signal_with_0(command, sig):
    """The README: `reach agent` and `reach coordinator` exit 0 once stopped by Ctrl-C or
    SIGTERM. While they waited for NATS (before they took their signals over), an outside
    trial saw SIGTERM kill them (143) and Ctrl-C end them with 130."""
    url = f"nats://127.0.0.1:{_free_port()}"
    argv = {
        "agent": ("agent", "agentreach.examples.summarize:agent", "--nats-url", url),
        "coordinator": ("coordinator", "--nats-url", url, "--metrics-port", "-1"),
    }[command]
    process = await started_until(
        reach_command(), *argv, said=b"waiting for NATS", as_from_a_terminal=True
    )
    try:
        process.send_signal(sig)
        await asyncio.wait_for(process.wait(), 30)
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    assert process.returncode == 0


def _free_port() -> int:
    """Below the ephemeral range: a server restarted on it finds it free (broker.ports)."""
    return free_ports("127.0.0.1", 1)[0]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()
