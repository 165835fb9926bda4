"""Constrained numbers for the config sections: a bad value fails at start with its path."""

from __future__ import annotations

from typing import Annotated

import msgspec

Positive = Annotated[int, msgspec.Meta(gt=0)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0)]
Ratio = Annotated[float, msgspec.Meta(gt=0, le=1)]
