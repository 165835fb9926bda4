"""`reach dashboard` run as a user runs it: a mistake on its command line is one line; the
URL it prints carries its access token, without which another process gets nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentreach.broker.dead_letters import dead_letter
from agentreach.envelopes import Task
from tests.cli.conftest import reach_argv, run
from tests.scrape import http_get


@pytest.mark.parametrize("port", ["70000", "-1"])
async def test_a_port_out_of_range_is_one_line_not_a_traceback(broker, port: str):
    """`--port 70000` is refused before anything starts, like `--metrics-port 70000` of
    `reach coordinator`, with the range it takes; no OverflowError from bind()."""
    done = await run(*reach_argv(broker, "dashboard", "--port", port), timeout=20)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"reach: error: --port takes 0-65535 (0: any free one); got {port}"
    ], done.stderr


@contextlib.asynccontextmanager
async def serving(
    broker, *options: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[re.Match[str], str]]:
    """`reach dashboard --port 0 OPTIONS` until the block ends; yields its line "dashboard on
    URL" (group 1: the URL up to the port's slash, group 2: what follows) and all it printed
    up to that line, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        *map(str, reach_argv(broker, "dashboard", "--port", "0", *options)),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            while True:
                line = (await process.stdout.readline()).decode()
                if not line:
                    raise AssertionError(f"reach dashboard exited:\n{''.join(seen)}")
                seen.append(line)
                if found := re.search(r"dashboard on (http://\S+?/)(\S*)", line):
                    break
        yield found, "".join(seen)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.communicate(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _status(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return (await http_get(url, headers=headers))[0]


# Another process on the host, with no NATS credentials: what the red-team probe ran.
OTHER_PROCESS = """
import json, sys, urllib.error, urllib.request
url, token = sys.argv[1], sys.argv[2]
def status(path, body=None):
    head = {"Origin": url.rstrip("/"), "X-Reach-Request": "1", "Content-Type": "application/json"}
    if token:
        head["Authorization"] = "Bearer " + token
    request = urllib.request.Request(url + path, data=body, headers=head)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code
forced = json.dumps({"force": True, "topic": "chosen_by_them"}).encode()
print(json.dumps([status("api/snapshot"), status("api/dlq/probed-1/replay", forced)]))
"""


async def _other_process(url: str, token: str = "") -> list[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    done = await run(sys.executable, "-c", OTHER_PROCESS, url, token, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_a_process_without_the_token_can_neither_read_nor_replay(broker, watcher):
    """The red-team's probe: another process on the host, no NATS creds, sends a forced
    replay to a topic of its choosing with every header the page sends (Host, Origin,
    X-Reach-Request, JSON): 401, and it cannot read the snapshot either; nothing replayed.
    The URL `reach dashboard` printed carries the token that makes the same request work."""
    task = Task(v=1, message_id="probed-1", trace_id="probed-1", topic="work", replays=3)
    await dead_letter(
        broker,
        reason="no_route",
        task=task,
        message_id="probed-1",
        trace_id="probed-1",
        topic="work",
    )
    async with serving(broker) as (said, _):
        url, token = said.group(1), said.group(2).removeprefix("?token=")
        without = await _other_process(url)
        wrong = await _other_process(url, token[:-1] + ("A" if token[-1] != "A" else "B"))
        health = await _status(url + "healthz")
        with_token = await _other_process(url, token)
        await watcher.event("replayed", message_id="probed-1")
    assert len(token) >= 32, said.group(0)
    assert without == [401, 401] and wrong == [401, 401]
    assert health == 200
    assert with_token == [200, 202]
    assert watcher.count("replayed") == 1  # the refused ones replayed nothing


async def test_a_token_file_is_made_once_then_read_and_never_printed(broker, tmp_path: Path):
    """--access-token-file PATH: a missing PATH is created, mode 600, with the token the URL
    printed; started again, the token is read from it and not printed (the output may go to a
    log), and a PATH others may read is warned about."""
    path = tmp_path / "dashboard-token"
    async with serving(broker, "--access-token-file", str(path)) as (said, _):
        printed = said.group(2).removeprefix("?token=")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == printed
    path.chmod(0o644)
    async with serving(broker, "--access-token-file", str(path)) as (said, output):
        url = said.group(1)
        statuses = [await _status(url + "api/snapshot", t) for t in (None, printed)]
    assert statuses == [401, 200]
    assert printed not in output
    assert f"dashboard on {url}?token=<the token in --access-token-file {path}>\n" in output
    assert f"chmod 600 {path}" in output


async def test_the_token_may_come_from_the_environment(broker):
    """$REACH_DASHBOARD_TOKEN is the token when no file is given; it is not printed."""
    token = "from-the-environment-0123456789"
    async with serving(broker, env={"REACH_DASHBOARD_TOKEN": token}) as (said, output):
        statuses = [await _status(said.group(1) + "api/snapshot", t) for t in (None, token)]
    assert statuses == [401, 200]
    assert token not in output


async def test_no_token_opens_it_to_everyone_and_says_so(broker):
    """--no-token: the API answers without a token, and the start warns who else can use it."""
    async with serving(broker, "--no-token") as (said, output):
        status = await _status(said.group(1) + "api/snapshot")
    assert status == 200
    assert said.group(2) == ""
    assert "no access token (--no-token)" in output and "any local user" in output


@pytest.mark.parametrize(
    ("options", "env", "said"),
    [
        (("--access-token-file", "{short}"), {}, "--access-token-file {short}: a token must be"),
        ((), {"REACH_DASHBOARD_TOKEN": "short"}, "$REACH_DASHBOARD_TOKEN: a token must be"),
        (("--no-token", "--access-token-file", "{short}"), {}, "not allowed with argument"),
    ],
)
async def test_a_token_that_cannot_be_used_is_one_line(
    broker, tmp_path: Path, options: tuple[str, ...], env: dict[str, str], said: str
):
    """A token too short to be unguessable, or --no-token with a token file, is refused
    before anything starts, in one line."""
    short = tmp_path / "short"
    short.write_text("hunter2\n")
    argv = [o.replace("{short}", str(short)) for o in options]
    done = await run(*reach_argv(broker, "dashboard", "--port", "0", *argv), env=env, timeout=20)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert said.replace("{short}", str(short)) in done.stderr.strip().splitlines()[-1], done.stderr
