"""Subject, stream and bucket names, all derived from one prefix (``reach``)."""

from __future__ import annotations

from typing import Final

import msgspec

from agentreach.broker.prefix import prefix_problem
from agentreach.envelopes import PRIORITIES, Priority

DEFAULT_PREFIX: Final = "reach"
# The sender token of what the coordinator itself publishes (a name no party may take).
COORDINATOR: Final = "_coordinator"
# The sender token of an operator's action without an identity of its own (open servers).
OPERATOR: Final = "_operator"
PROBE_INBOX: Final = "_INBOX_probe"  # an inbox: agents that answer only inboxes answer there


def probe_replies(asker: str) -> str:
    """Where the answers to ``asker``'s probes (presence, ping, discovery) go: the one
    place an agent may answer (it has no response permission: agentreach.auth.roles)."""
    return f"{PROBE_INBOX}.{asker}"


class Names(msgspec.Struct, frozen=True):
    """Every name Agent-Reach uses on the broker, for one prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if (problem := prefix_problem(self.prefix)) is not None:
            raise ValueError(problem)

    # -- subjects ---------------------------------------------------------------
    # Whatever a party sends names the sender in its subject's last token, so that
    # permissions can make it unforgeable and receivers can check the body's claims.
    def task(self, topic: str, sender: str | None = None) -> str:
        """Intake: ``reach.task.<topic>.<sender>`` for a caller, an agent's sub-task or a
        worker's replay; the bare ``reach.task.<topic>`` for operators."""
        subject = f"{self.prefix}.task.{topic}"
        return f"{subject}.{sender}" if sender else subject

    def coordinator_task(self, topic: str) -> str:
        """Intake of the tasks the coordinator publishes itself (reassignments, workflow
        steps, tasks a person sent on): ``reach.task.<topic>._coordinator``. Each intake
        subject has a bounded backlog, so on the operators' bare subject a burst of
        ``nats pub`` would refuse these; intake takes them as the bare form (their caller
        kept, nobody charged again)."""
        return self.task(topic, COORDINATOR)

    @property
    def tasks_wildcard(self) -> str:
        return f"{self.prefix}.task.>"

    def topic_of_task_subject(self, subject: str) -> str:
        """``reach.task.summarize.alice`` → ``summarize``."""
        return self.task_subject_parts(subject)[0]

    def task_subject_parts(self, subject: str) -> tuple[str, str | None]:
        """``reach.task.<topic>[.<sender>]`` → (topic, sender or None); with more tokens the
        sender is still the last (its refusal in its trace), the rest a topic refused."""
        rest = subject[len(self.prefix) + len(".task.") :]
        topic, dot, sender = rest.rpartition(".")
        if dot and sender:
            return topic, sender
        return rest, None

    def dispatch(self, agent_id: str, priority: Priority) -> str:
        return f"{self.prefix}.agent.{agent_id}.{priority.lower()}"

    def agent_of_dispatch_subject(self, subject: str) -> str:
        """``reach.agent.worker-1.p0`` → ``worker-1``."""
        return subject[len(self.prefix) + len(".agent.") : -len(".p0")]

    def dispatch_wildcard(self, priority: Priority) -> str:
        return f"{self.prefix}.agent.*.{priority.lower()}"

    def event(self, event: str, topic: str, trace_id: str, message_id: str, sender: str) -> str:
        """``reach.event.<event>.<topic>.<trace_id>.<message_id>.<sender>``."""
        return f"{self.prefix}.event.{event}.{topic}.{trace_id}.{message_id}.{sender}"

    def sender_of(self, subject: str) -> str:
        """The sender token an event's subject, or a signed reply's, ends with."""
        return subject.rsplit(".", 1)[-1]

    def kind_of_event_subject(self, subject: str) -> str:
        """``reach.event.<event>.…`` → the event's kind, as its subject names it."""
        return subject[len(self.prefix) + len(".event.") :].partition(".")[0]

    def events_of_message(self, message_id: str) -> str:
        return f"{self.prefix}.event.*.*.*.{message_id}.*"

    def events_of_message_in_trace(self, trace_id: str, message_id: str) -> str:
        """The events of one message, cheaper to find than :meth:`events_of_message`. The topic
        stays a wildcard: an ``auto`` task's events name its topic as resolved."""
        return f"{self.prefix}.event.*.*.{trace_id}.{message_id}.*"

    def events_of_message_of_kind(self, event: str, trace_id: str, message_id: str) -> str:
        """One kind of event about one message: its subject index finds them at once."""
        return f"{self.prefix}.event.{event}.*.{trace_id}.{message_id}.*"

    def events_of_kind_in_trace(self, event: str, trace_id: str) -> str:
        return f"{self.prefix}.event.{event}.*.{trace_id}.*.*"

    def events_of_trace(self, trace_id: str) -> str:
        return f"{self.prefix}.event.*.*.{trace_id}.*.*"

    def events_of_kind(self, event: str) -> str:
        return f"{self.prefix}.event.{event}.>"

    @property
    def events_wildcard(self) -> str:
        return f"{self.prefix}.event.>"

    def dlq(self, reason: str, topic: str) -> str:
        return f"{self.prefix}.dlq.{reason}.{topic}"

    @property
    def dlq_wildcard(self) -> str:
        return f"{self.prefix}.dlq.>"

    def settled(self, event: str, topic: str, trace_id: str, message_id: str, sender: str) -> str:
        """A dead letter's ``replayed`` or ``resolved`` event again, kept as long as the
        letter: ``reach.settled.<event>.<topic>.<trace_id>.<message_id>.<sender>``."""
        return f"{self.prefix}.settled.{event}.{topic}.{trace_id}.{message_id}.{sender}"

    def settled_of_kind(self, event: str) -> str:
        return f"{self.prefix}.settled.{event}.>"

    def settled_of_message_of_kind(self, event: str, trace_id: str, message_id: str) -> str:
        return f"{self.prefix}.settled.{event}.*.{trace_id}.{message_id}.*"

    @property
    def settled_wildcard(self) -> str:
        return f"{self.prefix}.settled.>"

    def audit(self, status: str, topic: str, trace_id: str, message_id: str) -> str:
        return f"{self.prefix}.audit.{status}.{topic}.{trace_id}.{message_id}"

    def audit_of_message(self, message_id: str) -> str:
        return f"{self.prefix}.audit.*.*.*.{message_id}"

    def audit_of_trace(self, trace_id: str) -> str:
        return f"{self.prefix}.audit.*.*.{trace_id}.*"

    @property
    def audit_wildcard(self) -> str:
        return f"{self.prefix}.audit.>"

    def call(self, topic: str, sender: str | None = None) -> str:
        """Core request/reply: ``nats req reach.call.<topic>[.<sender>] JSON`` answers with
        the result; the sender token counts as on ``reach.task.<topic>.<sender>``."""
        subject = f"{self.prefix}.call.{topic}"
        return f"{subject}.{sender}" if sender else subject

    @property
    def calls_wildcard(self) -> str:
        return f"{self.prefix}.call.>"

    def call_subject_parts(self, subject: str) -> tuple[str, str | None]:
        """``reach.call.<topic>[.<sender>]`` → (topic, sender or None)."""
        return self.task_subject_parts(self.task(subject[len(self.prefix) + len(".call.") :]))

    def reply_allowed(self, subject: str) -> bool:
        """Whether a task's replies may go to ``subject``: anywhere but our own subjects
        (a reply there would forge a task, an event or a dead letter), except a caller's
        reply box and a workflow's reply subject."""
        own = f"{self.prefix}."
        return not subject.startswith(own) or self.signed_reply(subject)

    def reply_box(self, caller: str, box: str) -> str:
        """Where ``caller`` receives the replies to its tasks: ``reach.reply.<caller>.<box>``;
        each reply arrives on ``<box subject>.<sender>``."""
        return f"{self.prefix}.reply.{caller}.{box}"

    def caller_of_reply_box(self, subject: str) -> str | None:
        """``reach.reply.alice.b1`` → ``alice``; None for any other subject."""
        head = f"{self.prefix}.reply."
        if not subject.startswith(head):
            return None
        caller, dot, box = subject[len(head) :].partition(".")
        return caller if dot and box and "." not in box else None

    def reply_subject(self, reply_to: str, sender: str) -> str:
        """Where a reply from ``sender`` goes: ``<reply_to>.<sender>`` for a reply box or a
        workflow (the sender made unforgeable there); ``reply_to`` itself for an operator's
        own inbox (``nats pub -H Reach-Reply-To:…``)."""
        return f"{reply_to}.{sender}" if self.signed_reply(reply_to) else reply_to

    def workflow_replies(self, subject: str) -> bool:
        """Whether ``subject`` is a workflow's reply subject: its engine reads only a step's
        result or error, and each reply sent there is stored in ``REACH_WORKFLOWS``."""
        return subject.startswith(f"{self.prefix}.wf.reply.")

    def signed_reply(self, subject: str) -> bool:
        """Whether replies to ``subject`` carry their sender's token (a box, a workflow)."""
        return subject.startswith(f"{self.prefix}.reply.") or self.workflow_replies(subject)

    # -- workflows --------------------------------------------------------------
    def workflow_reply(self, instance_id: str) -> str:
        """Where a workflow's step tasks answer (captured by ``REACH_WORKFLOWS``)."""
        return f"{self.prefix}.wf.reply.{instance_id}"

    def workflow_of(self, reply_to: str | None) -> str | None:
        """The instance a task answering to ``reply_to`` is a step of; None: not a step's."""
        if reply_to is None or not self.workflow_replies(reply_to):
            return None
        return reply_to.removeprefix(self.workflow_reply(""))

    def workflow_timer(self, instance_id: str) -> str:
        return f"{self.prefix}.wf.timer.{instance_id}"

    def workflow_signal(self, instance_id: str, event: str) -> str:
        return f"{self.prefix}.wf.signal.{instance_id}.{event}"

    def workflow_cancel(self, instance_id: str) -> str:
        return f"{self.prefix}.wf.cancel.{instance_id}"

    @property
    def workflows_wildcard(self) -> str:
        return f"{self.prefix}.wf.>"

    @property
    def workflows_stream(self) -> str:
        return f"{self.prefix.upper()}_WORKFLOWS"

    @property
    def workflows_bucket(self) -> str:
        return f"{self.prefix}_workflows"

    @property
    def coordinator_workflows(self) -> str:
        return "coordinator-workflows"

    # -- control (core NATS request/reply) -------------------------------------
    def presence(self, agent_id: str) -> str:
        """Answered by a live agent process; no responders means its connection is gone."""
        return f"{self.prefix}.presence.{agent_id}"

    def ping(self, agent_id: str) -> str:
        """The application-level ping, answered from the agent's task loop."""
        return f"{self.prefix}.ping.{agent_id}"

    def agent_control(self, agent_id: str) -> str:
        return f"{self.prefix}.ctl.agent.{agent_id}"

    def register(self, agent_id: str) -> str:
        """An agent asks for a registration slot as itself."""
        return f"{self.prefix}.ctl.register.{agent_id}"

    @property
    def registrations(self) -> str:
        return f"{self.prefix}.ctl.register.*"

    def trace_request(self, caller: str) -> str:
        """A caller asks the coordinator for the events of one of its own messages."""
        return f"{self.prefix}.ctl.trace.{caller}"

    @property
    def trace_requests(self) -> str:
        return f"{self.prefix}.ctl.trace.*"

    @property
    def clear(self) -> str:
        return f"{self.prefix}.ctl.clear"

    @property
    def status(self) -> str:
        """Every coordinator replica answers with its status (a core request)."""
        return f"{self.prefix}.ctl.status"

    @property
    def routes_reload(self) -> str:
        """Every coordinator replica answers: it re-reads its routing rules."""
        return f"{self.prefix}.ctl.routes.reload"

    # -- streams ----------------------------------------------------------------
    @property
    def tasks_stream(self) -> str:
        return f"{self.prefix.upper()}_TASKS"

    def dispatch_stream(self, priority: Priority) -> str:
        return f"{self.prefix.upper()}_DISPATCH_{priority}"

    @property
    def dispatch_streams(self) -> dict[Priority, str]:
        return {p: self.dispatch_stream(p) for p in PRIORITIES}

    @property
    def events_stream(self) -> str:
        return f"{self.prefix.upper()}_EVENTS"

    @property
    def dlq_stream(self) -> str:
        return f"{self.prefix.upper()}_DLQ"

    @property
    def settled_stream(self) -> str:
        return f"{self.prefix.upper()}_SETTLED"

    @property
    def audit_stream(self) -> str:
        return f"{self.prefix.upper()}_AUDIT"

    @property
    def history_streams(self) -> tuple[str, ...]:
        """The streams that are the record of what happened: nobody edits them, and the
        coordinator neither purges them nor changes their limits (a smaller limit is a
        purge by another name); an operator's `reach provision` does."""
        return (self.dlq_stream, self.events_stream, self.settled_stream, self.audit_stream)

    @property
    def limited_streams(self) -> tuple[str, ...]:
        """The streams a coordinator config's ``limits:`` bounds in bytes."""
        streams = (self.tasks_stream, self.dlq_stream, self.events_stream, self.settled_stream)
        stores = (f"OBJ_{self.payloads_bucket}", f"KV_{self.executions_bucket}")
        return (*streams, self.audit_stream, self.workflows_stream, *stores)

    @property
    def payloads_bucket(self) -> str:
        """The Object Store bucket of claim-checked payloads and results."""
        return f"{self.prefix}_payloads"

    # -- KV buckets -------------------------------------------------------------
    @property
    def agents_bucket(self) -> str:
        return f"{self.prefix}_agents"

    @property
    def heartbeats_bucket(self) -> str:
        return f"{self.prefix}_heartbeats"

    @property
    def liveness_bucket(self) -> str:
        return f"{self.prefix}_liveness"

    @property
    def executions_bucket(self) -> str:
        return f"{self.prefix}_executions"

    @property
    def leases_bucket(self) -> str:
        return f"{self.prefix}_leases"

    @property
    def breakers_bucket(self) -> str:
        return f"{self.prefix}_breakers"

    @property
    def quotas_bucket(self) -> str:
        """Callers' token buckets, shared by every coordinator replica."""
        return f"{self.prefix}_quotas"

    @property
    def manual_bucket(self) -> str:
        """Tasks waiting for a person (manual review), by message id."""
        return f"{self.prefix}_manual"

    # -- advisories -------------------------------------------------------------
    @property
    def advisories_stream(self) -> str:
        return f"{self.prefix.upper()}_ADVISORIES"

    @property
    def max_deliveries_advisories(self) -> tuple[str, ...]:
        """JetStream's advisories when a message hit max_deliver: in a dispatch stream, or
        in a stream the coordinator consumes (intake, outcome events, workflows)."""
        prefix = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
        streams = [
            *self.dispatch_streams.values(),
            self.tasks_stream,
            self.events_stream,
            self.workflows_stream,
        ]
        return tuple(f"{prefix}.{stream}.*" for stream in streams)

    # -- durable consumers ------------------------------------------------------
    @property
    def coordinator_intake(self) -> str:
        return "coordinator-intake"

    @property
    def coordinator_outcomes(self) -> str:
        return "coordinator-outcomes"

    @property
    def coordinator_advisories(self) -> str:
        return "coordinator-advisories"

    @property
    def coordinator_metrics(self) -> str:
        return "coordinator-metrics"

    @property
    def coordinator_audit(self) -> str:
        return "coordinator-audit"

    def agent_consumer(self, agent_id: str, priority: Priority) -> str:
        return f"agent-{agent_id}-{priority.lower()}"
