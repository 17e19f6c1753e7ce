"""bench/phases.py times the steps of billed requests as they run, and says what each cost."""

from __future__ import annotations

import subprocess
import sys

from tests.bench.test_run import ROOT, table_rows


def test_the_steps_of_a_billed_request_are_timed_in_its_flow():
    command = [sys.executable, "bench/phases.py", "--warm-up", "2", "--requests", "3"]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    assert "whole answer, gateway on SQLite, 3 requests one at a time" in done.stdout
    steps = {
        name.lstrip("· "): (float(us.replace(",", "")), float(calls))
        for name, us, calls in table_rows(done.stdout, 3)
    }
    for step in ("find the caller", "place the hold", "call the upstream", "settle the hold"):
        assert steps[step][1] == 1.0 and steps[step][0] > 0, done.stdout
    # The hold and the settlement: two transactions, each taking the write lock.
    assert steps["SQLite: take the write lock"][1] == 2.0, done.stdout
    # The caller found in the warm-up is remembered: the key is not looked up again.
    assert "look the key up in the database" not in steps, done.stdout
