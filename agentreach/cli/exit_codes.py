"""What ``reach`` exits with: one meaning per number, the same for every command (the README's
table of them is "Exit codes")."""

from __future__ import annotations

from typing import Final

from agentreach.errors import ReachError

OK: Final = 0  # done: stored, answered, found
# Failed or refused (a task ended without a result, a check found a fault, nothing found),
# or an error said on one line, `reach: error: …` (no server, a mistake the command found).
FAILED: Final = 1
USAGE: Final = 2  # the command line could not be parsed (argparse's own code)
# The outcome is not known yet: the task may still run (`reach publish --wait` gave up
# waiting). Not a failure: sending it again under a new id may run it twice.
OUTCOME_UNKNOWN: Final = 3
INTERRUPTED: Final = 130  # Ctrl-C: 128 + SIGINT, as shells report it


class OutcomeUnknown(ReachError):
    """The command stopped waiting while what it waited for may still happen: exits with
    :data:`OUTCOME_UNKNOWN`, not :data:`FAILED`."""
