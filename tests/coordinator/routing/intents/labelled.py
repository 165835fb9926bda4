"""The labelled set of bench/data/intents: agent cards and requests with their right intent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agentreach.coordinator.routing.intents.types import IntentText

DATA = Path(__file__).parents[4] / "bench" / "data" / "intents"
NONE = "none"


@dataclass(frozen=True)
class Request:
    """A labelled request; ``also`` names intents a reasonable person could also pick."""

    text: str
    intent: str
    also: tuple[str, ...] = ()

    @property
    def lang(self) -> str:
        """'zh' when the text has Chinese characters, else 'en'."""
        return "zh" if any("\u4e00" <= c <= "\u9fff" for c in self.text) else "en"


def load_cards() -> dict[str, IntentText]:
    """Intent name -> its description and examples, as agents would register them."""
    raw = json.loads((DATA / "cards.json").read_text(encoding="utf-8"))
    return {k: IntentText(v["description"], tuple(v["examples"])) for k, v in raw.items()}


def load_requests() -> list[Request]:
    """Every labelled request, in file order."""
    lines = (DATA / "requests.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [Request(r["text"], r["intent"], tuple(r.get("also", ()))) for r in rows]
