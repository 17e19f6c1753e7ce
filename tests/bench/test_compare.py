"""bench/compare.py serves a commit beside the working tree and reports both against the floor."""

from __future__ import annotations

import subprocess
import sys

from bench.compare import table
from bench.run import Figures, Scenario
from tests.bench.test_run import ROOT, assert_machine_speed_reported, table_rows


def compare_worktrees() -> set[str]:
    """Return the worktrees bench/compare.py made (in a temporary folder compare-*).

    Only those: other worktrees of the repository may come and go meanwhile.
    """
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = (line.removeprefix("worktree ") for line in listed.splitlines())
    return {path for path in paths if "/compare-" in path}


def test_a_commit_and_the_working_tree_are_measured_in_the_same_rounds(database_url):
    before = compare_worktrees()
    command = [
        sys.executable, "bench/compare.py", "--base", "HEAD", "--rounds", "2",
        "--requests", "6", "--concurrency", "3", "--scenario", "stream c=3",
    ]  # fmt: skip
    if database_url.startswith("postgresql"):
        # Each gateway gets a database of its own on the same server.
        command += ["--database-url", database_url]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    rows = table_rows(done.stdout, 12)
    assert [(row[0], row[1]) for row in rows] == [
        ("stream c=3", "floor"),
        ("stream c=3", "base HEAD"),
        ("stream c=3", "working tree"),
    ]
    for row in rows:
        assert all(len(row[column].split()) == 2 for column in (3, 5, 7, 9, 10)), row
        assert row[-1] == "0", row
    # CPU is read in ticks of 10 ms: a round of six requests may measure none ("-").
    assert rows[0][2] in ("1.00", "-") and rows[0][4] == "100%" and rows[0][6] == "+0.00"
    assert compare_worktrees() <= before, "the base's worktree was left behind"
    assert_machine_speed_reported(done.stdout)


def figures(cpu_us: float, rps: float, ttfb_ms: float = 1, database_cpu_us: float = 0) -> Figures:
    return Figures(
        cpu_us=cpu_us, upstream_cpu_us=0, database_cpu_us=database_cpu_us,
        p50_ms=1, p90_ms=1, p99_ms=1,
        ttfb_ms=ttfb_ms, rps=rps, busiest_worker=0.5, errors=0,
    )  # fmt: skip


def test_a_round_whose_floor_measured_no_cpu_shows_a_dash_and_is_left_out_of_the_median():
    scenario = Scenario("whole c=1", "bench-fast", False, 1)
    rounds = {
        ("whole c=1", "floor"): [figures(0, 100), figures(500, 100), figures(500, 50)],
        ("whole c=1", "new"): [figures(900, 50), figures(1000, 50), figures(1500, 40)],
    }

    rows = table_rows("\n".join(table(rounds, [scenario], ["floor", "new"])), 12)

    assert rows[1][2:6] == ["2.50", "- 2.00 3.00", "50%", "50 50 80"]


def test_the_time_to_first_byte_is_what_each_round_adds_to_its_floors():
    scenario = Scenario("stream c=1", "bench-fast", True, 1)
    rounds = {
        ("stream c=1", "floor"): [
            figures(500, 100, 0.6),
            figures(500, 100, 0.8),
            figures(500, 100, 2.0),
        ],
        ("stream c=1", "new"): [
            figures(900, 50, 1.5),
            figures(900, 50, 1.6),
            figures(900, 50, 2.5),
        ],
    }

    rows = table_rows("\n".join(table(rounds, [scenario], ["floor", "new"])), 12)

    assert rows[0][6:8] == ["+0.00", "+0.00 +0.00 +0.00"]
    assert rows[1][6:8] == ["+0.80", "+0.90 +0.80 +0.50"]


def test_the_database_servers_cpu_is_added_to_each_targets_own_against_the_floors():
    scenario = Scenario("whole c=1", "bench-fast", False, 1)
    rounds = {
        ("whole c=1", "floor"): [figures(500, 100), figures(0, 100), figures(400, 100)],
        ("whole c=1", "new"): [
            figures(600, 50, database_cpu_us=400),
            figures(700, 50, database_cpu_us=300),
            figures(600, 50, database_cpu_us=200),
        ],
    }

    rows = table_rows("\n".join(table(rounds, [scenario], ["floor", "new"])), 12)

    assert rows[0][8:10] == ["1.00", "1.00 - 1.00"]
    assert rows[1][2:4] == ["1.35", "1.20 - 1.50"]
    assert rows[1][8:10] == ["2.00", "2.00 - 2.00"]
