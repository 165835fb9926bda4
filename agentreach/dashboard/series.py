"""The snapshot's ``metrics``: each of the five series with its value, state, detail and
chart points, judged as of one moment (now, or when the dashboard last read NATS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentreach.dashboard.alerts import RULES, judge
from agentreach.dashboard.history import KEYS, LABELS, chart

if TYPE_CHECKING:
    from agentreach.dashboard.views import Board


def metrics(board: Board, *, at_ms: int, full: bool) -> dict[str, Any]:
    """The five series as of ``at_ms``: every point of the window when ``full``, else only
    the last (the event stream's tick)."""
    history = board.history
    rows = history.rows(at_ms)
    points = chart(rows)
    values = history.values(at_ms)
    series = {}
    for key in KEYS:
        label, unit = LABELS[key]
        state, since = judge(key, rows)
        entry: dict[str, Any] = {
            "key": key,
            "label": label,
            "unit": unit,
            "value": values[key],
            "state": state,
            "since_ms": since,
            "threshold": RULES[key].threshold(key),
            "detail": _detail(board, key, values),
        }
        if key == "p99_latency":
            entry["previous"] = values["previous"]
            needed = RULES["p99_latency"].min_completed
            # Both periods with enough completions to judge: else no change is shown.
            entry["comparable"] = (
                min(values["period_completed"], values["before_completed"]) >= needed
            )
        if key == "queue_fill":
            entry["worst"] = board.worst_queue
        if full:
            entry["points"] = points[key]
        else:
            entry["point"] = points[key][-1] if points[key] else None
        series[key] = entry
    return {
        "step_s": history.step_ms / 1000,
        "window_s": history.window_ms / 1000,
        "series": series,
    }


def _detail(board: Board, key: str, values: dict[str, Any]) -> str:
    """The counts behind a value, in one line: ``"1,532 of 1,534 completed, 5 min"``."""
    match key:
        case "success_rate":
            if not values["finished"]:
                return "nothing finished in 5 min"
            return f"{values['completed']:,} of {values['finished']:,} completed, 5 min"
        case "retry_rate":
            if not values["dispatches"]:
                return "nothing dispatched in 5 min"
            retries, dispatches = values["retries"], values["dispatches"]
            return f"{retries:,} retries of {dispatches:,} dispatches, 5 min"
        case "p99_latency":
            return _p99_detail(board.history.period_ms, values)
        case "queue_fill":
            worst = board.worst_queue
            line = "no agent running"
            if worst is not None:
                where, depth = f"{worst['agent_id']} {worst['priority']}", worst["depth"]
                line = f"{where} {depth}/{worst['capacity']}"
            # The agents' queues only: tasks no agent could be given wait in intake (with
            # every agent gone the card read "0.0 % OK" over 90 waiting tasks).
            if waiting := board.sampled.intake_backlog:
                line += f" · {waiting:,} in intake, not routed yet"
            return line
        case _:
            isolated = board.breakers.isolated
            return ", ".join(isolated) if isolated else "none"


def _p99_detail(period_ms: int, values: dict[str, Any]) -> str:
    period_s = period_ms / 1000
    period = f"{period_s / 60:g} min" if period_s >= 60 else f"{period_s:g} s"
    done, needed = values["period_completed"], RULES["p99_latency"].min_completed
    before = values["before_completed"]
    if done < needed:
        return f"{done:,} completed in {period}: too few to judge (< {needed})"
    if before < needed:
        return f"{done:,} completed in {period}, {before:,} before: too few to compare"
    return f"{done:,} completed in {period}, {before:,} before"


def fill(queue: dict[str, Any]) -> float:
    return float(queue["depth"] / queue["capacity"])


def worst(queues: list[dict[str, Any]]) -> tuple[float | None, dict[str, Any] | None]:
    """The fullest queue's fill, and the queue (None, None when there is none)."""
    if not queues:
        return None, None
    fullest = max(queues, key=fill)
    return fill(fullest), fullest
