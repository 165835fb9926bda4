"""``reach top``: the dashboard's essentials as text, redrawn in a terminal."""

from __future__ import annotations

import datetime as dt
from typing import Any

from agentreach.dashboard.history import shown

STATE_MARK = {"ok": "ok", "pending": "PENDING", "firing": "FIRING", "no_data": "no data"}


def render(snapshot: dict[str, Any]) -> str:
    """The five metrics, alerts, agents, dead letters and workflows of one snapshot."""
    at = dt.datetime.fromtimestamp(snapshot["at_ms"] / 1000).strftime("%H:%M:%S")
    system = snapshot["system"]
    replicas = len(system["replicas"])
    lines = [
        f"Agent-Reach {system['prefix']} · {system['nats']} · {replicas} coordinator"
        f" replica{'s' if replicas != 1 else ''}{'' if replicas else ' (none running!)'} · {at}",
        "",
    ]
    if system["stale_since_ms"] is not None:
        since = dt.datetime.fromtimestamp(system["stale_since_ms"] / 1000).strftime("%H:%M:%S")
        lines.insert(1, f"  NOT LIVE: it {system['stale_why']}; what follows is as of {since}")
    for entry in snapshot["metrics"]["series"].values():
        value = shown(entry["key"], entry["value"])
        mark = STATE_MARK.get(entry["state"], entry["state"])
        lines.append(
            f"  {entry['label']:<18} {value:>9}  {mark:<8} alert {entry['threshold']['text']:<34}"
            f" {entry['detail']}"
        )
    for alert in snapshot["alerts"]:
        lines.append(f"  ! {alert['severity'].upper()} {alert['name']}: {alert['summary']}")
    lines += ["", _agents(snapshot["agents"]), "", _letters(snapshot["dead_letters"])]
    lines.append(_workflows(snapshot["workflows"]))
    return "\n".join(lines)


def _agents(agents: list[dict[str, Any]]) -> str:
    if not agents:
        return "  no agents registered"
    rows = [f"  {'AGENT':<22} {'STATE':<9} {'LOAD':>7}  {'P0':>5} {'P1':>5} {'P2':>5}  BREAKERS"]
    for agent in agents:
        beat = agent["heartbeat"] if agent["state"] not in ("OFFLINE", "STOPPED") else None
        load = f"{beat['in_flight']}/{beat['in_flight'] + beat['free_slots']}" if beat else "-"
        queues = [agent["queues"].get(p, {}).get("depth", 0) for p in ("P0", "P1", "P2")]
        state = "QUARANT." if agent["quarantined"] else agent["state"]
        breakers = ",".join(f"{b['intent'] or 'ISOLATED'}:{b['state']}" for b in agent["breakers"])
        rows.append(
            f"  {agent['agent_id']:<22} {state:<9} {load:>7}  {queues[0]:>5} {queues[1]:>5}"
            f" {queues[2]:>5}  {breakers or '-'}"
        )
    rows.append("  LOAD: handlers running / slots (last heartbeat); P0-P2: queue depth")
    return "\n".join(rows)


def _letters(letters: dict[str, Any]) -> str:
    reasons = ", ".join(f"{r['reason']} {r['count']}" for r in letters["by_reason"]) or "none"
    waiting = (
        f", {letters['open']} open (nobody replayed or resolved them)" if letters["open"] else ""
    )
    return f"  dead letters: {letters['total']} kept ({reasons}){waiting}"


def _workflows(workflows: dict[str, Any]) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in workflows["by_status"].items()) or "none"
    return f"  workflows in flight: {counts}"
