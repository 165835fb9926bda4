"""The operator's walk through intent resolution, with the real `nats` and `reach` binaries:
two agents with overlapping descriptions, free text on reach.task.auto, the confidence in
`reach trace`, the unsure request in `reach manual list`, a person's answer to the caller."""

from __future__ import annotations

import json
import re

import pytest

from agentreach.agents import ReachClient
from agentreach.envelopes import Result
from tests.cli.conftest import reach_argv, run
from tests.cli.test_nats_cli import nats_pub
from tests.e2e.intent_support import SURE_REFUND, SURE_RISK, UNSURE, Caller, overlapping_agents
from tests.e2e.routing_support import serving
from tests.secured import operators_reply_to

pytestmark = pytest.mark.nats_cli


async def reach(broker, *args: str):  # type: ignore[no-untyped-def]
    done = await run(*reach_argv(broker, *args))
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_operator_resolves_free_text_and_answers_the_unsure_one(
    nats_cli, broker, coordinator, watcher
):
    """Sure requests are routed with their confidence; the unsure one waits in `reach manual
    list`; `reach manual answer` delivers the person's answer to the caller's reply subject."""
    reply_to, _ = operators_reply_to(broker, "operator")  # secured: the operator's own box
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        Caller(broker, reply_to) as caller,
    ):
        for message_id, text in (
            ("auto-1", SURE_REFUND),
            ("auto-2", SURE_RISK),
            ("auto-3", UNSURE),
        ):
            body = json.dumps({"text": text})
            sent = await nats_pub(
                nats_cli,
                broker,
                "auto",
                body,
                f"Nats-Msg-Id:{message_id}",
                f"Reach-Reply-To:{reply_to}",
            )
            assert sent.returncode == 0, sent.stderr
        await watcher.event("completed", message_id="auto-1")
        await watcher.event("completed", message_id="auto-2")
        await watcher.event("routed", message_id="auto-3")
        refund = await reach(broker, "trace", "auto-1")
        waiting = await reach(broker, "manual", "list")
        as_json = await reach(broker, "manual", "list", "--json")
        typo = await run(*reach_argv(broker, "manual", "send", "auto-3", "risk_reveiw"))
        taken = await reach(broker, "manual", "take", "auto-3", "--as", "alice")
        answered = await reach(
            broker, "manual", "answer", "auto-3", '{"refunded": true}', "--as", "alice"
        )
        result = await caller.reply("auto-3", "result")
        await watcher.event("completed", message_id="auto-3")
        unsure = await reach(broker, "trace", "auto-3")
        left = await reach(broker, "manual", "list")
    assert "resolved 'refund_application' 1.00 over 'risk_review' 0.00" in refund
    assert "→ customer-service" in refund
    (line,) = [row for row in waiting.splitlines() if row.startswith("auto-3")]
    assert " review " in line and "below 0.75 for rule 'default'" in line and "waiting" in line
    assert not any(row.startswith(("auto-1", "auto-2")) for row in waiting.splitlines())
    (item,) = [json.loads(row) for row in as_json.splitlines()]
    assert (item["message_id"], item["status"], item["task"]["topic"]) == (
        "auto-3",
        "waiting",
        "auto",
    )
    assert typo.returncode != 0 and "no registered agent serves topic 'risk_reveiw'" in typo.stderr
    assert "--force" in typo.stderr
    assert re.search(r"taken by alice for (899|900) s", taken) and "answered by alice" in answered
    assert isinstance(result, Result) and result.result == {"refunded": True}
    assert "below 0.75: 'risk_review'" in unsure and "→ manual-review queue 'review'" in unsure
    assert "person:alice" in unsure and '{"refunded": true}' in unsure
    assert left.strip() == "no tasks waiting for a person"


async def test_operator_rejects_an_unsure_request_and_the_caller_hears_why(
    broker, coordinator, watcher
):
    """`reach manual reject ID WHY` dead-letters the task as rejected, WHY in the caller's
    error; `take --for 0` and `--force` outside `send` are refused by name."""
    async with (
        serving(broker, coordinator, *overlapping_agents()),
        Caller(broker, broker.names.reply_box("client", "reject")) as caller,
        ReachClient(broker=broker) as client,
    ):
        message_id, _ = await client.publish("auto", {"text": UNSURE}, reply_to=caller.subject)
        await watcher.event("routed", message_id=message_id)
        zero = await run(*reach_argv(broker, "manual", "take", message_id, "--for", "0"))
        misplaced = await run(*reach_argv(broker, "manual", "take", message_id, "--force"))
        rejected = await reach(broker, "manual", "reject", message_id, "not ours", "--as", "eve")
        error = await caller.reply(message_id, "error")
        letter = await watcher.dead_letter("rejected", message_id=message_id)
    assert zero.returncode != 0 and "more than 0" in zero.stderr
    assert misplaced.returncode != 0 and "--force is for manual send" in misplaced.stderr
    assert f"{message_id}: rejected by eve" in rejected
    said = "rejected by eve in manual-review queue 'review': not ours"
    assert error.error.message == said and letter.error is not None  # type: ignore[union-attr]
