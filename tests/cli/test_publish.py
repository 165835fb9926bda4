"""`reach publish`: who it sends as, and what it says and exits with when a task does not
end well."""

from __future__ import annotations

from agentreach.broker import read_stream
from tests.cli.conftest import reach_argv, reach_command, run
from tests.secured import SECURED


async def test_publish_sends_as_the_caller_client_as_its_help_says(broker):
    """The task is stored on reach.task.TOPIC.client (the caller `client`; the name in the
    creds when given), and --help says so and that the caller's quota applies."""
    published = await run(*reach_argv(broker, "publish", "summarize", "{}"))
    helped = await run(reach_command(), "publish", "--help")
    stored = await read_stream(broker, broker.names.tasks_stream, broker.names.tasks_wildcard)
    caller = "admin" if SECURED else "client"  # the suite's operator creds, when secured
    assert published.returncode == 0, published.stderr
    assert [m.subject for m in stored] == [broker.names.task("summarize", caller)]
    said = " ".join(helped.stdout.split())
    assert "reach.task.TOPIC.client" in said and "quota" in said, said
