"""The ``dead_letters`` events of one event stream: the counts, the order of the letters
shown (by stream sequence), and only the letters the page does not already have as they
are. The whole section (the last 50 letters and up to 200 open ones) was ~100 KB, sent
again at every new letter."""

from __future__ import annotations

from typing import Any

COUNTS = ("total", "by_reason", "open", "open_not_shown")


class LetterDeltas:
    """What one connection's page holds of the dead letters, from its snapshot on."""

    def __init__(self, section: dict[str, Any]) -> None:
        self._held = _by_seq(section)

    def delta(self, section: dict[str, Any]) -> dict[str, Any]:
        """The event that brings the page from what it holds to ``section``."""
        letters = _by_seq(section)
        changed = [shown for seq, shown in letters.items() if self._held.get(seq) != shown]
        self._held = letters
        return {
            **{key: section[key] for key in COUNTS},
            "recent_seqs": [shown["seq"] for shown in section["recent"]],
            "open_seqs": [shown["seq"] for shown in section["open_letters"]],
            "letters": changed,
        }


def _by_seq(section: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {shown["seq"]: shown for shown in section["recent"] + section["open_letters"]}
