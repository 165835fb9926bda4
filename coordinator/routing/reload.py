"""Reloading routing rules without a restart: on a change of the config file, or when
``reach routes reload`` asks every replica on ``reach.ctl.routes.reload``.

Only the ``routing`` section is applied; a file that does not decode keeps the
rules in use and says what is wrong. Decisions under way finish with the table
they started with, and nothing queued is touched, so no task is lost. A change of
any other section (workflows, liveness, limits, …) takes effect at the next start:
the reload says which sections changed since this one started, every time, until
then.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import structlog

from agentreach import envelopes
from agentreach.broker import Inbound
from agentreach.broker.errors import pause
from agentreach.coordinator.config import ConfigError, CoordinatorConfig, load_config
from agentreach.coordinator.routing.router import Router
from agentreach.envelopes import ReloadReply

log = structlog.get_logger("coordinator.routing.reload")


class RouteReloader:
    """Re-reads the coordinator's config file into the router's rule table."""

    def __init__(self, router: Router, path: Path | None, replica: str) -> None:
        self._router = router
        self._path = path
        self._replica = replica
        self._seen = self._stamp()
        self._started_with = self._load_quietly()  # the file as this process started

    def reload(self) -> ReloadReply:
        if self._path is None:
            return self._reply(ok=False, error="this coordinator was started without --config")
        self._seen = self._stamp()
        try:
            routing = load_config(self._path).routing
        except ConfigError as exc:
            log.error("routing rules not reloaded", error=str(exc))
            return self._reply(ok=False, error=str(exc))
        self._router.reload(routing)
        return self._reply(ok=True, restart_for=self._say_what_waits_for_a_restart())

    def _say_what_waits_for_a_restart(self) -> list[str]:
        now, then = self._load_quietly(), self._started_with
        if now is None or then is None:
            return []
        changed = [
            name
            for name in now.__struct_fields__
            if name != "routing" and getattr(now, name) != getattr(then, name)
        ]
        if changed:
            log.warning(
                "the config file changed sections a reload does not apply: restart to apply"
                " them (every replica alike)",
                sections=changed,
                path=str(self._path),
            )
        return changed

    def _load_quietly(self) -> CoordinatorConfig | None:
        try:
            return load_config(self._path) if self._path else None
        except ConfigError:
            return None

    async def on_request(self, msg: Inbound) -> None:
        """``reach routes reload``: a request, answered by every replica. A message with no
        inbox to answer is none: the server's empty answer to a ``+WPI`` on an ack subject,
        which any agent can aim here, had every replica reload once per message."""
        if msg.answerable:
            await msg.respond(envelopes.encode(self.reload()))

    async def watch(self, every_s: float) -> None:
        """Reload whenever the file changes, until cancelled."""
        if self._path is None:
            return
        while True:
            await pause(every_s)
            if self._stamp() != self._seen:
                log.info("config file changed; reloading routing rules", path=str(self._path))
                self.reload()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self._path.stat() if self._path else None
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size) if stat else None

    def _reply(
        self, *, ok: bool, error: str = "", restart_for: list[str] | None = None
    ) -> ReloadReply:
        rules = [r.name for r in self._router.routing.rules]
        return ReloadReply(
            replica=self._replica,
            ok=ok,
            rules=rules,
            error=error,
            restart_for=restart_for or [],
            config_sha256=self._digest(),
        )

    def _digest(self) -> str:
        try:
            return hashlib.sha256(self._path.read_bytes()).hexdigest() if self._path else ""
        except OSError:
            return ""
