"""bench/history.py seeds three histories, times every read of them, and audits the long one."""

from __future__ import annotations

import subprocess
import sys

from tests.bench.test_run import ROOT

READS = (
    "usage page",
    "usage, one model",
    "usage, one key",
    "usage, last 30 days",
    "keys page",
    "balance page",
    "usage, next page",
    "CSV, first MB",
    "GET /v1/key",
    "GET /v1/credits",
    "GET /v1/generations/{id}",
)


def test_a_small_run_times_every_read_of_each_account_and_audits_clean():
    command = [sys.executable, "bench/history.py", "--generations", "2000", "--rounds", "1"]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    timed = {line[:28].strip(): line[28:].split() for line in done.stdout.splitlines()}
    for read in READS:
        long_ms, short_ms, _, _, mid_ms, _, _ = timed[read]
        assert float(long_ms) > 0 and float(short_ms) > 0 and float(mid_ms) > 0, done.stdout
    assert "audit --full: " in done.stdout and ", 2000 generations, 0 mismatches" in done.stdout
    assert "audit since its checkpoint: " in done.stdout
