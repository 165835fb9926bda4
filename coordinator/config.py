"""The coordinator's configuration, read from YAML into frozen Structs: one section per
concern, so a mistake fails at start with the path of the mistake.

    prefix: reach
    broker:      {replicas: auto, durable: false, durable_tags: [sync:always], url: …,
                  auth: {creds, nkey, token_file, user, password_file, tls_ca, tls_cert, …}}
    intake:      {batch: 64, ack_wait_s: 5}
    delivery:    {max_attempts: 3, attempts_by_topic: {}, base_s: 1, cap_s: 30, batch: 64}
    liveness:    {tick_s: 1, probe_connection_s: 3, probe_ping_s: 5, ...}
    lease_ttl_s: 10
    routing:     {min_confidence: 0.75, below: {manual: review}, rules: [...], resolve: {...},
                  reload_poll_s: 1}
    manual:      {ttl_s: 86400}
    queues:      {capacity: {P0: 10, P1: 200, P2: 1000}, high_watermark: 0.8, ...}
    breakers:    {window_s: 300, error_ratio: 0.4, ...}
    rate_limits: {topics: {...}, agents: {...}, wait_s: 0.1,
                  callers: {default: {rate: 100, burst: 200}, <caller>: {rate: 10, burst: 50}}}
    security:    {seal_key_file: /etc/reach/auth/coordinator.seal}
    workflows:   {<name>: <definition>}
    metrics:     {port: 9464, host: 127.0.0.1}        # /metrics, /healthz, /readyz
    audit:       {enabled: true, keep_days: 30}
    claim_check: {threshold_bytes: 262144, keep_days: 30}

``rate_limits.callers`` gives callers quotas (``default``: every caller not named): one token
bucket per caller in KV ``reach_quotas``, shared by every replica, charged a token by each of
the caller's tasks, workflow signals and cancels; without it, no caller is limited. The
topics' and agents' buckets are each replica's own.
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Annotated, Any

import msgspec
import structlog

from agentreach.broker import BrokerConfig, Names, Topology
from agentreach.broker.auth import AuthConfig
from agentreach.broker.limits import StorageLimits
from agentreach.broker.prefix import PREFIX_PATTERN, prefix_problem
from agentreach.coordinator.delivery.retries import RetryConfig
from agentreach.coordinator.delivery.unreported import UnreportedConfig
from agentreach.coordinator.liveness.config import LivenessConfig
from agentreach.coordinator.liveness.queue_expiry import QueueExpiryConfig
from agentreach.coordinator.observability.config import (
    AuditConfig,
    ClaimCheckConfig,
    MetricsConfig,
)
from agentreach.coordinator.protection.circuit import BreakerConfig
from agentreach.coordinator.protection.grants import SecurityConfig
from agentreach.coordinator.protection.queues import QueueConfig
from agentreach.coordinator.protection.rate_limits import RateLimits
from agentreach.coordinator.routing.manual import ManualConfig
from agentreach.coordinator.routing.rules import RoutingConfig
from agentreach.coordinator.units import Positive, PositiveSeconds
from agentreach.coordinator.workflows.spec import State, WorkflowSpec, meant
from agentreach.coordinator.yaml_keys import line_of, twice_given
from agentreach.envelopes.messages import Token, is_token
from agentreach.envelopes.misfits import first_misfit
from agentreach.errors import ReachError

log = structlog.get_logger("coordinator.config")


class ConfigError(ReachError):
    """The configuration file is missing or wrong; the message names where."""


class IntakeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the coordinator takes tasks from ``REACH_TASKS``."""

    batch: Positive = 64
    # A task a replica died holding is taken by another after this (well inside the default
    # ttl of 30 s); one that is handled longer is kept alive meanwhile.
    ack_wait_s: PositiveSeconds = 5.0


class DeliveryConfig(RetryConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Retries and dead-lettering of what agents report; ``batch`` outcome events at a time."""

    batch: Positive = 64


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Tunables of one coordinator replica (every replica should share them)."""

    prefix: Annotated[str, msgspec.Meta(pattern=PREFIX_PATTERN)] = "reach"
    broker: BrokerConfig = BrokerConfig()  # replicas and placement of streams and buckets
    intake: IntakeConfig = IntakeConfig()
    delivery: DeliveryConfig = DeliveryConfig()
    liveness: LivenessConfig = LivenessConfig()
    # Tasks past their ttl in the queue of an agent that does not take them.
    queue_expiry: QueueExpiryConfig = QueueExpiryConfig()
    unreported: UnreportedConfig = UnreportedConfig()
    lease_ttl_s: PositiveSeconds = 10.0  # a dead replica's duties move after at most this
    routing: RoutingConfig = RoutingConfig()
    manual: ManualConfig = ManualConfig()  # tasks waiting for a person (manual review)
    queues: QueueConfig = QueueConfig()
    breakers: BreakerConfig = BreakerConfig()
    rate_limits: RateLimits = RateLimits()
    security: SecurityConfig = SecurityConfig()
    workflows: dict[Token, WorkflowSpec] = {}  # started by a task on reach.task.<name>
    metrics: MetricsConfig = MetricsConfig()
    audit: AuditConfig = AuditConfig()
    claim_check: ClaimCheckConfig = ClaimCheckConfig()
    limits: StorageLimits = StorageLimits()  # what streams and buckets keep at most, in bytes

    def topology(self, names: Names, replication: BrokerConfig | None = None) -> Topology:
        """The streams and buckets this config asks for; ``replication``: the broker section
        as the command line changed it (``reach provision --replicas``)."""
        replication = replication or self.broker
        return Topology.default(
            names,
            queue_capacity=self.queues.capacities,
            replicas=replication.replicas,
            work_tags=replication.work_tags,
            audit_days=self.audit.keep_days,
            payload_days=self.claim_check.keep_days,
            limits=self.limits,
        )


# Keys of the flat layout before sections (0.1), and where they live now.
_MOVED = {
    "intake_batch": ("intake", "batch"),
    "intake_ack_wait_s": ("intake", "ack_wait_s"),
    "outcome_batch": ("delivery", "batch"),
    "max_attempts": ("delivery", "max_attempts"),
    "attempts_by_topic": ("delivery", "attempts_by_topic"),
    "retry_base_s": ("delivery", "base_s"),
    "retry_cap_s": ("delivery", "cap_s"),
    "liveness_tick_s": ("liveness", "tick_s"),
    "heartbeat_reread_s": ("liveness", "heartbeat_reread_s"),
    "adaptive_beats": ("liveness", "adaptive_beats"),
    "probe_connection_s": ("liveness", "probe_connection_s"),
    "probe_ping_s": ("liveness", "probe_ping_s"),
    "flapping_limit": ("liveness", "flapping_limit"),
    "registration_rate": ("liveness", "registration_rate"),
    "registration_burst": ("liveness", "registration_burst"),
    "routes_poll_s": ("routing", "reload_poll_s"),
}


def shared_settings(config: CoordinatorConfig) -> CoordinatorConfig:
    """What every replica should share: ``config`` without where this one listens for
    scrapes, connects, or reads its creds and seal key (per host: two replicas on one host
    differ in their metrics port, and were said to run different configurations)."""
    broker = msgspec.structs.replace(config.broker, url=None, auth=AuthConfig())
    security = msgspec.structs.replace(config.security, seal_key_file=None)
    return msgspec.structs.replace(
        config, metrics=MetricsConfig(), broker=broker, security=security
    )


def load_config(path: Path | str | None) -> CoordinatorConfig:
    """Decode the YAML file at ``path``, or the defaults when ``path`` is None."""
    if path is None:
        return CoordinatorConfig()
    document: Any = None
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read coordinator config {path}: {exc.strerror}") from None
    try:
        document = msgspec.yaml.decode(raw) if raw.strip() else None
        if document is None:  # a file half-written by an editor would reset every rule
            raise ConfigError(
                f"{path}: holds no settings (empty, or comments only); to run on the defaults,"
                " give no config file"
            )
        if (twice := twice_given(raw)) is not None:
            raise ConfigError(f"{path}: {twice}")
        return msgspec.convert(_sectioned(document, path), CoordinatorConfig)
    except msgspec.DecodeError as exc:  # ValidationError is one
        said = _meant_field(_one_line(str(exc)))
        if said.endswith("- at `$.prefix`") and isinstance(document.get("prefix"), str):
            said = prefix_problem(document["prefix"]) or said
        said = _with_key_named(_with_workflow_named(said, document), document)
        raise ConfigError(f"{path}: {_with_line(said, raw)}") from None


def _one_line(message: str) -> str:
    """A YAML parser's message (four lines, naming `"<byte string>"`) as one line."""
    message = re.sub(r'\s*in "<byte string>", (line \d+, column \d+)', r" (\1)", message)
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def _meant_field(message: str) -> str:
    """An unknown field of a section with the one it may have meant (`routes`: 'routing');
    the workflows' own say theirs (:func:`meant`)."""
    unknown = re.fullmatch(
        r"Object contains unknown field `([^`]+)`(?: - at `\$([\w.]*)`)?", message
    )
    if unknown is None:
        return message
    section: Any = CoordinatorConfig
    for name in filter(None, (unknown[2] or "").split(".")):
        section = typing.get_type_hints(section).get(name)
        if not (isinstance(section, type) and issubclass(section, msgspec.Struct)):
            return message
    close = difflib.get_close_matches(unknown[1], section.__struct_fields__, n=1)
    return f"{message} (did you mean {close[0]!r}?)" if close else message


def _with_workflow_named(message: str, document: Any) -> str:
    """msgspec shows a dict key as ``[...]``; a mistake in a workflow names the workflow
    (and the state, and the field it may have meant)."""
    marker = "`$.workflows[...]"
    workflows = document.get("workflows") if isinstance(document, dict) else None
    if not isinstance(workflows, dict):
        return message
    if message.endswith("- at `key` in `$.workflows`"):
        bad = next((n for n in workflows if not is_token(n)), None)
        return f"workflow name {bad!r}: use 1-128 letters, digits, '_' or '-' (it names subjects)"
    if marker not in message:
        return message
    for name, definition in workflows.items():
        try:
            msgspec.convert(definition, WorkflowSpec)
        except msgspec.ValidationError:
            # A mistake placed within the workflow (`$.fanout.branches[0].input`) says where.
            text = re.sub(
                r"`\$\.([^`]+)` - at `\$\.workflows\[\.\.\.\]`", r"`$.workflows[...].\1`", message
            )
            text = text.replace(marker, f"`$.workflows.{name}")
            return f"workflow {name!r}: {meant(_state_named(text, definition))}"
    return message


def _with_line(message: str, raw: bytes) -> str:
    """``message`` with the line of the value it names (` - at `$.a.b``), when found: a
    schema error gave a path alone, where a YAML syntax error gives a line (a trial)."""
    at = re.search(r" - at `(\$[^`]*)`$", message)
    if at is None:
        return message
    path = at[1]
    # The key at fault is named before the path, which ends at its mapping.
    if named := re.match(
        r"(?:Object contains unknown field `([\w-]+)`|[\w.]*?\.([\w-]+) = )", message
    ):
        path = f"{path}.{named[1] or named[2]}"
    line = line_of(raw, path) or line_of(raw, at[1])
    return f"{message} (line {line})" if line else message


def _with_key_named(message: str, document: Any) -> str:
    """Any other dict's ``[...]`` (``rate_limits.callers[...].rate``) made the key whose
    value is at fault (``rate_limits.callers.default.rate``): which caller was not said."""
    found = re.search(r"`\$\.([\w.]+)\[\.\.\.\]", message)
    if found is None:
        return message
    section: Any = CoordinatorConfig
    entries: Any = document
    for name in found[1].split("."):
        if not isinstance(section, type):
            return message
        section = typing.get_type_hints(section, include_extras=True).get(name)  # with Metas
        if typing.get_origin(section) is typing.Annotated:
            section = typing.get_args(section)[0]
        entries = entries.get(name) if isinstance(entries, dict) else None
    if (misfit := first_misfit(entries, section)) is None:
        return message
    return message.replace(f"`$.{found[1]}[...]", f"`$.{found[1]}.{misfit[0]}", 1)


def _state_named(text: str, definition: Any) -> str:
    """``states.states[...]`` made ``states.states.<the state at fault>``."""
    machine = definition.get("states") if isinstance(definition, dict) else None
    states = machine.get("states") if isinstance(machine, dict) else None
    if ".states.states[...]" not in text or not isinstance(states, dict):
        return text
    for name, state in states.items():
        try:
            msgspec.convert(state, State)
        except msgspec.ValidationError:
            return text.replace(".states.states[...]", f".states.states.{name}")
    return text


def _sectioned(document: Any, path: Path | str) -> Any:
    """Move the keys of the flat 0.1 layout into their sections (and say so)."""
    if not isinstance(document, dict):
        return document
    moved = [key for key in document if key in _MOVED]
    for key in moved:
        section, name = _MOVED[key]
        target = document.setdefault(section, {})
        if isinstance(target, dict):
            target.setdefault(name, document.pop(key))
    if moved:
        where = ", ".join(f"{k} → {'.'.join(_MOVED[k])}" for k in moved)
        log.warning(
            "config keys moved into sections; please update the file", path=str(path), moved=where
        )
    return document
