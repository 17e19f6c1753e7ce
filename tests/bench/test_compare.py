"""bench/compare.py serves a commit beside the working tree and reports both against the floor."""

from __future__ import annotations

import subprocess
import sys

from tests.bench.test_run import ROOT, table_rows


def worktrees() -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout


def test_a_commit_and_the_working_tree_are_measured_in_the_same_rounds():
    before = worktrees()
    command = [
        sys.executable, "bench/compare.py", "--base", "HEAD", "--rounds", "2",
        "--requests", "6", "--concurrency", "3", "--scenario", "stream c=3",
    ]  # fmt: skip

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    rows = table_rows(done.stdout, 8)
    assert [(row[0], row[1]) for row in rows] == [
        ("stream c=3", "floor"),
        ("stream c=3", "base HEAD"),
        ("stream c=3", "working tree"),
    ]
    for row in rows:
        assert len(row[3].split()) == len(row[5].split()) == len(row[6].split()) == 2, row
        assert row[-1] == "0", row
    assert rows[0][2] == "1.00" and rows[0][4] == "100%"
    assert worktrees() == before, "the base's worktree was left behind"
