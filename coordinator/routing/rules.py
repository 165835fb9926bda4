"""Routing rules: typed from YAML, ordered, first match wins.

A rule matches a task by topic (exact or glob) and by conditions on envelope,
header or payload fields, and names a destination: an intent pool, one agent,
a tag selector, a weighted split, a canary, a manual-review queue or the
dead-letter stream. The last rule is the fallback and must say so; a table
without one is refused.

Every task carries a confidence in its topic: 1 when the sender named it, the
calibrated probability of the resolved intent when the coordinator found it from
the text (``reach.task.auto``). A matching rule takes the task only when that
confidence, times the rule's own ``confidence`` (default 1), reaches the rule's
``min_confidence`` (default ``routing.min_confidence``); otherwise the table goes
on, and if no later rule takes it the task goes to the ``below`` destination of
the first rule that matched (default ``routing.below``: manual review). So the
table ``intent → destination, confidence, fallback`` reads as written:

    routing:
      min_confidence: 0.75
      rules:
        - name: refunds-to-risk
          match: {topic: refund_application}
          min_confidence: 0.87
          to: {agent: risk_control_agent}
          below: {manual: review}
        - name: big-refunds
          match: {topic: "refund_*", where: [{field: payload.amount, op: ">=", value: 1000}]}
          to: {intent: manual_review}
        - name: fallback
          fallback: true
          to: {dlq: no_route}
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from agentreach.coordinator.conditions import MISSING, Comparison, lookup
from agentreach.coordinator.routing.intents.resolver import ResolveConfig, describe
from agentreach.coordinator.routing.intents.scorers import check_scorer
from agentreach.envelopes import Task, is_token
from agentreach.envelopes.messages import Token

Percent = Annotated[float, msgspec.Meta(gt=0, lt=100)]
Weight = Annotated[float, msgspec.Meta(gt=0)]
Confidence = Annotated[float, msgspec.Meta(ge=0, le=1)]

_ENVELOPE_FIELDS = frozenset(
    {"message_id", "trace_id", "topic", "from_agent", "attempt", "priority", "ttl_ms", "replay_of"}
)


def parse_tags(selector: Mapping[str, str] | str) -> dict[str, str]:
    """``"role=worker, region=cn-east"`` (or a mapping already) → ``{"role": "worker", …}``."""
    if not isinstance(selector, str):
        return dict(selector)
    tags: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"tag selector {selector!r}: expected key=value, got {part!r}")
        tags[key.strip()] = value.strip()
    return tags


class Condition(Comparison, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``field op value``: ``field`` is an envelope field, ``header.<Name>`` or ``payload.<a.b>``"""

    def __post_init__(self) -> None:
        root = self.field.split(".", 1)[0]
        if root not in ("header", "payload") and self.field not in _ENVELOPE_FIELDS:
            known = ", ".join(sorted(_ENVELOPE_FIELDS))
            raise ValueError(
                f"unknown field {self.field!r}: use header.<Name>, payload.<path> or one of {known}"
            )
        if root == "header" and "." not in self.field:
            raise ValueError("field 'header' needs a name: header.<Name>")
        super().__post_init__()

    def holds(self, task: Task) -> bool:
        return self.holds_for(_found(task, self.field))


def _found(task: Task, field: str) -> Any:
    root, _, rest = field.partition(".")
    if root == "header":
        return task.headers.get(rest, MISSING)
    if root == "payload":
        return lookup(task.payload, rest)
    return getattr(task, field)


class Match(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which tasks a rule takes: topic glob and every condition of ``where``."""

    topic: str = "*"
    where: list[Condition] = []

    def holds(self, task: Task) -> bool:
        return topic_matcher(self.topic)(task.topic) and all(c.holds(task) for c in self.where)

    def not_compared(self, task: Task) -> str | None:
        """Why ``task``, of a topic this match takes, was not compared by a condition (a
        value of another type than the condition's), or None."""
        if not topic_matcher(self.topic)(task.topic):
            return None
        for condition in self.where:
            if (why := condition.not_compared(_found(task, condition.field))) is not None:
                return why
        return None


@functools.cache
def topic_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of whether a topic is one the glob ``pattern`` names."""
    if not any(ch in pattern for ch in "*?["):
        return pattern.__eq__
    if pattern == "*":
        return lambda _: True
    return re.compile(fnmatch.translate(pattern)).match  # type: ignore[return-value]


class Target(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A set of agents: those serving ``intent`` (default: the task's topic), narrowed
    to one ``agent`` or to those carrying ``tags``."""

    intent: Token | None = None
    agent: Token | None = None
    tags: dict[str, str] | str = {}

    def __post_init__(self) -> None:
        parse_tags(self.tags)


class Share(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One branch of a weighted split."""

    weight: Weight
    to: Target
    name: str = ""


class Canary(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``percent`` of the traffic to the agents of the pool that carry ``tags``."""

    percent: Percent
    tags: dict[str, str] | str

    def __post_init__(self) -> None:
        if not parse_tags(self.tags):
            raise ValueError("a canary needs tags that pick its agents")


class Destination(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a rule sends its tasks (exactly one kind of destination)."""

    intent: Token | None = None
    agent: Token | None = None
    tags: dict[str, str] | str = {}
    split: list[Share] | None = None
    canary: Canary | None = None
    dlq: Token | None = None
    manual: Token | None = None  # a manual-review queue, drained with `reach manual`

    def __post_init__(self) -> None:
        parse_tags(self.tags)
        pool_fields = self.intent or self.agent or self.tags
        for end in ("dlq", "manual"):
            if getattr(self, end) and (pool_fields or self.split or self.canary or self.ends != 1):
                raise ValueError(f"'{end}' cannot be combined with any other destination")
        if self.split is not None:
            if pool_fields or self.canary:
                raise ValueError("'split' cannot be combined with intent, agent, tags or canary")
            if len(self.split) < 2:
                raise ValueError("a 'split' needs at least two branches")
        if self.canary and self.agent:
            raise ValueError("a canary needs a pool of agents, not one 'agent'")

    @property
    def ends(self) -> int:
        """How many of the destinations that are not agents (dlq, manual) are named."""
        return bool(self.dlq) + bool(self.manual)


MANUAL_REVIEW = Destination(manual="review")


class Rule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One row of the table: which tasks (``match``), where (``to``), how sure the task's
    topic must be (``min_confidence``), and where it goes when it is less sure (``below``)."""

    name: str
    to: Destination
    match: Match = Match()
    confidence: Confidence = 1.0  # how sure you are of this route; multiplies the task's
    min_confidence: Confidence | None = None  # None: routing.min_confidence
    below: Destination | None = None  # None: routing.below
    fallback: bool = False

    def __post_init__(self) -> None:
        if not is_token(self.name):
            raise ValueError(f"rule name {self.name!r}: use letters, digits, '_' or '-'")
        if self.fallback and self.match != Match():
            raise ValueError(f"fallback rule {self.name!r} takes every task: it has no 'match'")


def default_rules() -> list[Rule]:
    """Without a table: every task to the agents serving its topic."""
    return [Rule(name="default", fallback=True, to=Destination())]


@dataclass(frozen=True, slots=True)
class Decision:
    """Where the table sends a task: ``rule``'s destination, or (``below``) the destination
    for tasks whose confidence did not reach what ``rule`` needed."""

    rule: Rule
    to: Destination
    needed: float
    below: bool = False
    # Rules before ``rule`` a condition of which could not compare the task's value.
    not_compared: dict[str, str] = dataclasses.field(default_factory=dict)

    def held(self, task: Task) -> Task:
        """``task`` as sent to manual review or the DLQ: when not sure enough, on the topic it
        was sent on (its guess stays in its resolution), so that a replay of its letter, or a
        person's look at it, starts from what the sender said, not from a rejected guess."""
        to_agents = not (self.to.dlq or self.to.manual)
        if to_agents or not self.below or task.resolution is None:
            return task
        return msgspec.structs.replace(task, topic=task.resolution.topic)

    def held_reason(self, task: Task, where: str) -> str:
        """Why ``task`` goes to ``where`` (manual review, the DLQ) and not to an agent, in one
        line for the queue, the letter and the trace."""
        if not self.below:
            return f"rule {self.rule.name!r} sends {task.topic!r} to {where}"
        basis = describe(task.resolution) if task.resolution else f"topic {task.topic!r}"
        if task.resolution is not None and task.resolution.best is None:
            return f"no intent found for rule {self.rule.name!r}: {basis}"  # nothing scored
        return f"below {self.needed:.2f} for rule {self.rule.name!r}: {basis}"


class RoutingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ordered rule table; see the module's docstring for how confidence is used.
    ``resolve`` says which tasks get their intent from their text (None: ``reach.task.auto``,
    when the ``intents`` extra is installed)."""

    min_confidence: Confidence = 0.75
    below: Destination = MANUAL_REVIEW
    rules: list[Rule] = msgspec.field(default_factory=default_rules)
    resolve: ResolveConfig | None = None
    reload_poll_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0  # config file checks; at start

    def __post_init__(self) -> None:
        if not self.rules or not self.rules[-1].fallback:
            raise ValueError(
                "the last rule must be the fallback (`fallback: true`), sending what no other"
                " rule takes to an intent such as manual_review, or to `dlq: no_route`"
            )
        fallbacks = [r.name for r in self.rules if r.fallback]
        if len(fallbacks) > 1:
            raise ValueError(f"only the last rule may be a fallback; found {fallbacks}")
        names = [r.name for r in self.rules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"rule names must be unique; repeated: {duplicates}")
        if self.resolve is not None and self.resolve.topics:
            check_scorer(self.resolve.scorer)  # asked for: a missing extra fails at start

    @property
    def fallback(self) -> Rule:
        return self.rules[-1]

    def dead_letter_reasons(self) -> list[tuple[str, str]]:
        """``(topic glob, reason)`` for each rule that may dead-letter a task (``dlq`` in its
        ``to`` or its ``below``), so that the metrics can create those series at 0."""
        return [
            (rule.match.topic, destination.dlq)
            for rule in self.rules
            for destination in (rule.to, rule.below or self.below)
            if destination.dlq
        ]

    def first_match(self, task: Task) -> Rule:
        """The rule whose destination (or ``below`` destination) ``task`` goes to."""
        return self.decide(task).rule

    def decide(self, task: Task) -> Decision:
        """The first matching rule sure enough of ``task``; else the ``below`` destination of
        the first rule that matched. A task whose topic the sender named always has the
        fallback rule: only a resolved one can be too unsure for every rule."""
        unsure: Decision | None = None
        not_compared: dict[str, str] = {}
        for rule in self.rules:
            if not (rule.fallback or rule.match.holds(task)):
                if (why := rule.match.not_compared(task)) is not None:
                    not_compared[rule.name] = why
                continue
            needed = self.min_confidence if rule.min_confidence is None else rule.min_confidence
            if task.confidence * rule.confidence >= needed or (
                rule.fallback and task.resolution is None
            ):
                return Decision(rule, rule.to, needed, not_compared=not_compared)
            if unsure is None:
                below = rule.below or self.below
                unsure = Decision(rule, below, needed, below=True, not_compared=dict(not_compared))
        assert unsure is not None  # the fallback rule matches every task
        return unsure


@dataclass(frozen=True, slots=True)
class Pool:
    """One group of agents a destination may choose, with its share of the traffic."""

    label: str
    intent: str
    weight: float = 1.0
    agent: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    without_tags: tuple[tuple[str, str], ...] = ()

    def admits(self, agent_id: str, agent_tags: Mapping[str, str]) -> bool:
        if self.agent is not None and agent_id != self.agent:
            return False
        if any(agent_tags.get(k) != v for k, v in self.tags):
            return False
        return not self.without_tags or any(agent_tags.get(k) != v for k, v in self.without_tags)


def pools_of(destination: Destination, topic: str) -> list[Pool]:
    """The pools ``destination`` spreads a task of ``topic`` over (none for a dlq or a manual
    review queue)."""
    if destination.ends:
        return []
    if destination.split is not None:
        return [
            _pool(share.name or f"split{i}", share.to, topic, share.weight)
            for i, share in enumerate(destination.split)
        ]
    target = Target(intent=destination.intent, agent=destination.agent, tags=destination.tags)
    base = _pool("pool", target, topic, 1.0)
    if destination.canary is None:
        return [base]
    canary_tags = tuple(sorted(parse_tags(destination.canary.tags).items()))
    share = destination.canary.percent
    return [
        Pool("canary", base.intent, share, tags=tuple(sorted({*base.tags, *canary_tags}))),
        Pool("stable", base.intent, 100 - share, tags=base.tags, without_tags=canary_tags),
    ]


def _pool(label: str, target: Target, topic: str, weight: float) -> Pool:
    return Pool(
        label=label,
        intent=target.intent or topic,
        weight=weight,
        agent=target.agent,
        tags=tuple(sorted(parse_tags(target.tags).items())),
    )
