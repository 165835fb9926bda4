"""One line describing what an event says, as ``reach trace`` prints it and the dashboard's
timeline shows it."""

from __future__ import annotations

import json
from typing import Any

from agentreach.envelopes.messages import Event


def described(event: Event) -> str:
    """What ``event`` says beyond its kind, attempt and sender, in one line."""
    d = event.detail
    match event.event:
        case "routed":
            return _routed(event)
        case "completed":
            by = "answered by a person, " if d.get("answered_by") else ""
            by = "said for its agent (the run recorded it), " if d.get("from_record") else by
            late = d.get("past_deadline_ms")
            late = f" (past its {late} ms deadline: it could not be stopped)" if late else ""
            return f"{by}in {d.get('duration_ms', '?')} ms{late}, result {_result(d)}"
        case "manual_taken":
            return f"taken in manual-review queue {d.get('queue')!r}"
        case "manual_sent":
            return f"sent on to {d.get('topic')!r} as {d.get('sent_as')}"
        case "manual_rejected":
            return f"rejected in manual-review queue {d.get('queue')!r}"
        case "failed" | "expired" | "rejected":
            return _error(d.get("error"))
        case "dead_lettered":
            error = d.get("error") or {}
            return f"reason {d.get('reason')}: {error.get('message', '')}"
        case "progress":
            return str(d.get("note", ""))
        case "replayed":
            by = f", by {d['by']}" if d.get("by") else ""
            return f"as {d.get('replayed_as')} on {d.get('topic')!r}, replay {d.get('replays')}{by}"
        case "resolved":
            by = f", by {d['by']}" if d.get("by") else ""
            return f"note {d.get('note')!r}{by}"
        case "retry_scheduled":  # why the next attempt comes, whole: it was cut at 80 columns
            delay = d.get("delay_ms") or 0
            when = f"in {delay} ms" if delay else "at once"
            return f"attempt {d.get('next_attempt')} {when}, after {_error(d.get('error'))}"
        case "received":  # no event of its own: the intake's time, which the events echo
            return "stored by the intake"
        case "accepted":  # the dispatch's broker time is for machines; a second process is news
            return f"by process epoch {d['epoch']}" if d.get("epoch") else ""
        case _:
            shown = {k: v for k, v in d.items() if k != "grant"}  # the dispatch's proof, no news
            return _short(shown) if shown else ""


def _routed(event: Event) -> str:
    d = event.detail
    rule = f"rule {d['rule']}: " if "rule" in d else ""
    resolved = _resolution(d.get("resolution"), d.get("needed"))
    if d.get("manual"):
        return f"{resolved}{rule}→ manual-review queue {d['manual']!r}"
    candidates = _some(d.get("candidates") or [], shown=5)
    line = f"{resolved}{rule}→ {event.agent_id} (candidates: {candidates})"
    if d.get("trial"):
        line += " trial call"
    passed = d.get("passed_over") or {}
    if passed:
        line += "; passed over " + _grouped(passed)
    for name, why in (d.get("rules_not_compared") or {}).items():
        line += f"; rule {name} not taken: {why}"
    return line


def _grouped(passed_over: dict[str, str]) -> str:
    """``agent stopped: a-1, a-2, a-3 +4; b-1: circuit open …``: agents passed over for the
    same reason said once (a fleet's worth of STOPPED agents made a line of a screen)."""
    by_why: dict[str, list[str]] = {}
    for agent, why in passed_over.items():
        by_why.setdefault(why, []).append(agent)
    said = []
    for why, agents in by_why.items():
        said.append(f"{_some(agents)}: {why}" if len(agents) > 1 else f"{agents[0]}: {why}")
    return "; ".join(said)


def _some(names: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names``, and how many more."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" +{more}" if more > 0 else "")


def _resolution(resolution: Any, needed: Any) -> str:
    """ "resolved 'refund_application' 0.87 over 'complaint' 0.41 · " for a task whose intent
    was found from its text; "below 0.75: …" when it was not sure enough."""
    if not isinstance(resolution, dict):
        return ""
    best, second = resolution.get("best"), resolution.get("runner_up")
    if not isinstance(best, dict):
        return f"not resolved: {resolution.get('note') or 'no candidate'} · "
    line = f"'{best.get('intent')}' {best.get('confidence', 0):.2f}"
    if isinstance(second, dict):
        line += f" over '{second.get('intent')}' {second.get('confidence', 0):.2f}"
    sure = isinstance(needed, int | float) and best.get("confidence", 0) >= needed
    if sure or not isinstance(needed, int | float):
        return f"resolved {line} · "
    return f"below {needed:.2f}: {line} · "


def _error(error: Any) -> str:
    if not isinstance(error, dict):
        return ""
    retry = "" if error.get("retryable", True) else " (permanent)"
    return f"{error.get('type')}: {error.get('message')}{retry}"


def _result(detail: dict[str, Any]) -> str:
    """The result, or where it is kept when it travelled by claim check."""
    ref = detail.get("result_ref")
    if isinstance(ref, dict):
        return (
            f"in the object store: {ref.get('bucket')}/{ref.get('name')} ({ref.get('size')} bytes)"
        )
    return _short(detail.get("result"))


def _short(value: Any, width: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"
