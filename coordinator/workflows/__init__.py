"""Workflows: chain, fan-out / fan-in, step graphs and state machines over ordinary tasks.

- :mod:`.spec`: the definitions (from YAML) and :mod:`.builder` (the same in Python);
  :mod:`.precedence`: what may name what in them, and what in them is never used;
  :mod:`.templates`: input paths;
- :mod:`.run`: how one instance moves on (on :mod:`.visits`, the moves every form shares),
  and :mod:`.saga` how it is undone (pure);
- :mod:`.deadline`: when an instance ends, done or not; :mod:`.nesting`: workflows that run
  workflows (no loops, a depth limit);
- :mod:`.engine`: the coordinator's side, records in KV and messages on ``REACH_WORKFLOWS``,
  and :mod:`.outbox` what it then does (tasks, timers, notes, withdrawals, the answer);
- :mod:`.control`: reading, cancelling and signalling instances from outside.
"""

from agentreach.coordinator.workflows.control import all_records, cancel, read_record, signal
from agentreach.coordinator.workflows.engine import WorkflowEngine
from agentreach.coordinator.workflows.spec import WorkflowSpec

__all__ = ["WorkflowEngine", "WorkflowSpec", "all_records", "cancel", "read_record", "signal"]
