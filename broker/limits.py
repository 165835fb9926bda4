"""What a party can make the server keep: the coordinator config's ``limits:``."""

from __future__ import annotations

import msgspec

from agentreach.broker.claim_check import DEFAULT_THRESHOLD

KIB = 1024
# Tasks one intake subject (one caller's topic) holds at most: one or two seconds of intake
# on a two-core machine, and room for a burst of a thousand published at once.
DEFAULT_TASKS_PER_SUBJECT = 1000


class StorageLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a party can make the server keep (the coordinator config's ``limits:``, in
    bytes; -1 is unlimited).

    Value sizes are on by default: a bucket refuses a larger value ("message size exceeds
    maximum allowed", err_code 10054). Byte limits on streams are off by default: JetStream
    reserves a stream's ``max_bytes`` on every server holding a replica, so a default that
    fits one server's ``max_file_store`` fails to provision on another; the total is the
    account's JetStream limit. Set, they refuse new writes when full (discard new), so no
    work is dropped unseen: a caller's publish to a full intake fails, and a dead letter the
    coordinator cannot store keeps its message, which comes back until there is room.

    ``tasks_per_subject`` bounds, in messages, what one intake subject holds not yet taken
    by the coordinator: ``reach.task.<topic>.<caller>`` is one caller's backlog on one
    topic, so a caller that floods a topic is refused at the server (``SubjectFull``, err_code
    10077) past it, instead of standing before every other caller's tasks in the one intake.
    Its default is on, in messages (no reservation is made for it); -1 turns it off."""

    tasks_bytes: int = -1  # intake waiting for the coordinator
    tasks_per_subject: int = DEFAULT_TASKS_PER_SUBJECT
    dead_letters_bytes: int = -1
    # Lifecycle events are history: full, the oldest go (a refused write would stall the
    # coordinator's own events, and a party flooding the stream would stop everyone's).
    events_bytes: int = -1
    # Records kept as long as the letters (settled) or the audit days: full, a new write is
    # refused (its writer is told, or its event comes back until there is room).
    settled_bytes: int = -1
    audit_bytes: int = -1
    payloads_bytes: int = -1  # the claim check's Object Store
    workflows_bytes: int = -1  # full, a signal is refused; a step's reply comes again
    # A result up to the claim-check threshold inline; a larger one's reference.
    record_bytes: int = DEFAULT_THRESHOLD + 64 * KIB
    # Every record together: an agent may write any key of its own, and one wrote 2.3 GB of
    # them in 20 s. Full, a new record is refused (a claim fails; the task is tried again).
    records_bytes: int = -1
    card_bytes: int = 128 * KIB  # an agent's intents, with their descriptions and examples
    small_value_bytes: int = 16 * KIB  # heartbeats, liveness, breakers, leases, quotas

    def __post_init__(self) -> None:
        # 0 or below -1 was taken as "no limit" by the server: a bound gone, silently (a trial).
        for name in self.__struct_fields__:
            if (value := getattr(self, name)) != -1 and value < 1:
                raise ValueError(f"limits.{name} = {value}: expected -1 (no limit) or 1 or more")
