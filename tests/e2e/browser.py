"""Headless Chromium driven over the DevTools protocol on a pipe, with the standard library
only (``--remote-debugging-pipe``: commands on fd 3, answers on fd 4, each a JSON text ended
by NUL), so neither Node, Playwright nor a websocket library is needed.

``--virtual-time-budget`` would hang on the dashboard (an open event stream is a pending
request, and virtual time never advances past it), and a plain ``--screenshot`` races the
first snapshot: polling the page's own facts is what makes the test deterministic.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # we run as root in CI containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)

# What the page says about itself (index.html keeps these current), read in one evaluation.
FACTS_JS = """(() => {
  const html = document.documentElement;
  const metrics = {};
  for (const el of document.querySelectorAll("[data-metric]")) {
    metrics[el.dataset.metric] = { state: el.dataset.state, value: el.dataset.value,
                                   shown: el.querySelector(".value").textContent };
  }
  return {
    live: html.dataset.live,
    liveText: (document.getElementById("live-text") || {}).textContent,
    staleSince: Number(html.dataset.staleSince || 0) || null,
    notLive: (document.getElementById("stale") || { hidden: true }).hidden ? null
      : document.getElementById("stale").textContent,
    replicasText: (document.getElementById("replicas") || {}).textContent,
    updates: Number(html.dataset.updates || 0),
    snapshotAt: Number(html.dataset.snapshotAt || 0),
    metrics,
    agents: [...document.querySelectorAll("[data-agent-id]")].map((el) => el.dataset.agentId),
    agentText: Object.fromEntries([...document.querySelectorAll("[data-agent-id]")]
      .map((el) => [el.dataset.agentId, el.textContent.replace(/\\s+/g, " ")])),
    heartbeats: Object.fromEntries([...document.querySelectorAll("[data-agent-id]")]
      .map((el) => [el.dataset.agentId, el.querySelector("[data-heartbeat]").textContent])),
    letters: document.querySelectorAll("[data-message-id]").length,
    letterAges: [...document.querySelectorAll(".letter [data-ago]")].map((el) => el.textContent),
    letterStates: Object.fromEntries([...document.querySelectorAll("[data-message-id]")]
      .map((el) => [el.dataset.messageId, el.querySelector("[data-letter-state]").textContent])),
    replayButtons: document.querySelectorAll("[data-replay]").length,
    resolveButtons: document.querySelectorAll("[data-resolve]").length,
    deadLetterReasons: [...document.querySelectorAll("[data-reason]")]
      .map((el) => el.dataset.reason),
    workflows: document.querySelectorAll("[data-instance-id]").length,
    traceDrawn: document.querySelector("#timeline svg") !== null,
    traceId: (document.getElementById("timeline") || { dataset: {} }).dataset.traceId || null,
  };
})()"""

FIVE = ("success_rate", "p99_latency", "queue_fill", "retry_rate", "isolated_agents")


class Browser:
    """One headless Chromium on a DevTools pipe; a context manager that always stops it."""

    def __init__(self, executable: str, width: int, height: int) -> None:
        self._executable = executable
        self._size = f"--window-size={width},{height}"
        self._next_id = 0
        self._buffer = b""

    def __enter__(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="reach-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Chromium expects the pipe on fds 3 (its input) and 4 (its output). Both ends are
        # copied out of the way first, in case one of them already is fd 3 or 4.

        def wire() -> None:
            inbound, outbound = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(inbound, 3)  # dup2 leaves the copy inheritable
            os.dup2(outbound, 4)

        self._proc = subprocess.Popen(
            [
                self._executable,
                *CHROMIUM_FLAGS,
                self._size,
                f"--user-data-dir={self._profile}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire,
            close_fds=False,  # our other descriptors are not inheritable (PEP 446)
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close", timeout=5)
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self._profile, ignore_errors=True)

    def call(
        self,
        method: str,
        params: dict | None = None,
        *,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Send one command and wait for its answer (events in between are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error'].get('message')}")
                return answer.get("result", {})

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its DevTools pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str) -> str:
        """A new page at ``url``; returns the session id to talk to it."""
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        return self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=session,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page error: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, session: str, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", {"format": "png"}, session=session)
        path.write_bytes(base64.b64decode(shot["data"]))

    def facts(self, session: str) -> dict[str, Any]:
        """What the page says about itself (data-* attributes), or {} while it loads."""
        try:
            return self.evaluate(session, FACTS_JS) or {}
        except RuntimeError:
            return {}

    def wait_for(self, session: str, check: Any, timeout: float = 30.0) -> dict[str, Any]:
        """Poll the page's facts until ``check(facts)`` is true; the last facts either way."""
        deadline = time.monotonic() + timeout
        while True:
            facts = self.facts(session)
            if check(facts) or time.monotonic() > deadline:
                return facts
            time.sleep(0.25)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")
