"""The fault run's seeds and length, its upstream process, its catalog and its Redis.

``FAULT_RUN_SEEDS`` (comma-separated, default 1) picks the seeds, one run each per
database; ``FAULT_RUN_SECONDS`` (default 40) the length of each run's load.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import _free_port
from tests.contract.test_rate_limits import private_redis

HERE = Path(__file__).resolve().parent
DEFAULT_SEEDS = "1"
DEFAULT_SECONDS = 40.0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run ``fault_seed``-taking tests once per seed of FAULT_RUN_SEEDS."""
    if "fault_seed" in metafunc.fixturenames:
        seeds = os.environ.get("FAULT_RUN_SEEDS", DEFAULT_SEEDS)
        metafunc.parametrize("fault_seed", [int(seed) for seed in seeds.split(",") if seed.strip()])


@pytest.fixture
def fault_run_seconds() -> float:
    """How long the load of one run lasts: FAULT_RUN_SECONDS, else 40 s."""
    return float(os.environ.get("FAULT_RUN_SECONDS", DEFAULT_SECONDS))


@dataclass(frozen=True)
class Upstream:
    """The fake upstream's process and port."""

    process: subprocess.Popen
    port: int


@pytest.fixture
def fake_upstream(tmp_path: Path) -> Iterator[Upstream]:
    """Run tests/faults/upstream.py in a process of its own, until the test ends."""
    port = _free_port()
    with open(tmp_path / "upstream.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(HERE / "upstream.py"), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, process)
        yield Upstream(process, port)
    finally:
        # A run that failed while the upstream was stopped must not leave it stopped.
        process.send_signal(signal.SIGCONT)
        process.terminate()
        process.wait(timeout=30)


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 15) -> None:
    """Return once something listens on ``port``; raise if ``process`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the upstream exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the upstream never listened")


@pytest.fixture
def fault_catalog(tmp_path: Path, fake_upstream: Upstream) -> str:
    """Return the path of the run's catalog, naming the fake upstream's port."""
    catalog = tmp_path / "models.toml"
    template = (HERE / "models.toml").read_text()
    catalog.write_text(template.replace("UPSTREAM_PORT", str(fake_upstream.port)))
    return str(catalog)


@pytest.fixture
def redis_port() -> Iterator[int]:
    """Run a Redis of the run's own (its counters are keyed by key ids, per database)."""
    port = _free_port()
    with private_redis(port):
        yield port
