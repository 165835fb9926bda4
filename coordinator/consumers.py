"""The coordinator's durable consumers: what each reads, and how patiently.

Every replica binds the same ones, so JetStream spreads their messages across replicas.
"""

from __future__ import annotations

from agentreach.broker import ConsumerSpec, Names
from agentreach.coordinator.config import CoordinatorConfig
from agentreach.coordinator.delivery.outcomes import OUTCOME_EVENTS
from agentreach.coordinator.observability import FOLDED, TERMINAL

# Delivery limits: a backstop under the poison path. A task waiting for an agent comes back
# at most every 10 s within its ttl (a day at most), so intake never needs more.
MAX_DELIVER_INTAKE = 20_000
MAX_DELIVER_OTHER = 1_000
# What a replica that died holding a message (an outcome, a workflow's step, an ending to
# audit) held comes back to another after this; it is kept alive while it is handled.
ACK_WAIT_S = 5.0


def intake(names: Names, config: CoordinatorConfig) -> ConsumerSpec:
    return ConsumerSpec(
        stream=names.tasks_stream,
        durable=names.coordinator_intake,
        filter_subjects=(names.tasks_wildcard,),
        ack_wait_s=config.intake.ack_wait_s,
        max_deliver=MAX_DELIVER_INTAKE,
    )


def outcomes(names: Names, config: CoordinatorConfig) -> ConsumerSpec:
    # Who says `completed` is checked by the audit writer, which reads it anyway.
    audited = config.audit.enabled
    kinds = [e for e in OUTCOME_EVENTS if not (audited and e == "completed")]
    return ConsumerSpec(
        stream=names.events_stream,
        durable=names.coordinator_outcomes,
        filter_subjects=tuple(names.events_of_kind(e) for e in kinds),
        ack_wait_s=ACK_WAIT_S,
        max_deliver=MAX_DELIVER_INTAKE,  # retries wait within the ttl too
    )


def advisories(names: Names) -> ConsumerSpec:
    return ConsumerSpec(
        stream=names.advisories_stream,
        durable=names.coordinator_advisories,
        filter_subjects=names.max_deliveries_advisories,
        ack_wait_s=ACK_WAIT_S,
        max_deliver=MAX_DELIVER_OTHER,
    )


def workflows(names: Names) -> ConsumerSpec:
    return ConsumerSpec(
        stream=names.workflows_stream,
        durable=names.coordinator_workflows,
        filter_subjects=(names.workflows_wildcard,),
        ack_wait_s=ACK_WAIT_S,
        max_ack_pending=-1,  # timers wait here, held back until due
        max_deliver=MAX_DELIVER_OTHER,
    )


# Counting and auditing start at new events: history is not counted as one burst.
def metrics(names: Names) -> ConsumerSpec:
    return ConsumerSpec(
        stream=names.events_stream,
        durable=names.coordinator_metrics,
        filter_subjects=tuple(names.events_of_kind(e) for e in FOLDED),
        new_only=True,
        acknowledged=False,
    )


def audit(names: Names) -> ConsumerSpec:
    return ConsumerSpec(
        stream=names.events_stream,
        durable=names.coordinator_audit,
        filter_subjects=tuple(names.events_of_kind(e) for e in TERMINAL),
        ack_wait_s=ACK_WAIT_S,
        max_deliver=MAX_DELIVER_OTHER,
        new_only=True,
    )
