"""The fuzz tests share one seed per run; it is printed so that a run can be repeated."""

from __future__ import annotations

import pytest

from tests.fuzz.strategies import SEED


@pytest.fixture(scope="session", autouse=True)
def announce_fuzz_seed() -> None:
    """Print the seed once (shown with -s, and with the first failure's captured output)."""
    print(f"fuzz seed {SEED}: repeat with FUZZ_SEED={SEED}")
