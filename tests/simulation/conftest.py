"""The simulation's seeds and steps (``--seed``, ``--steps``)."""

from __future__ import annotations

import pytest

DEFAULT_SEEDS = (1, 2, 3, 4)
DEFAULT_STEPS = 500


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run ``seed``-taking tests once per default seed, or only with ``--seed``."""
    if "seed" in metafunc.fixturenames:
        seed = metafunc.config.getoption("--seed")
        metafunc.parametrize("seed", DEFAULT_SEEDS if seed is None else [seed])


@pytest.fixture
def steps(request: pytest.FixtureRequest) -> int:
    """Steps of each run: ``--steps``, or enough for the default run to stay short."""
    return request.config.getoption("--steps") or DEFAULT_STEPS


@pytest.fixture
def schedule_file(tmp_path) -> str:
    """Where a failed run writes its whole schedule."""
    return tmp_path / "schedule.txt"
