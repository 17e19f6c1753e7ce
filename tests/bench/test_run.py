"""The benchmark harness runs end to end and reports every row, so that it cannot rot.

A handful of requests only: no figure is checked against a time, only that each
scenario of each target and the memory benchmark produced a row without failed requests.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench.run import busiest_share, python_loop_seconds, ratio, scenarios

ROOT = Path(__file__).resolve().parent.parent.parent
CONCURRENCY = 3


def table_rows(output: str, columns: int) -> list[list[str]]:
    """Return the cells of the Markdown table rows with ``columns`` columns, headers skipped."""
    rows = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == columns and not cells[0].startswith("-"):
            rows.append(cells)
    return rows[1:] if rows else rows


def run_bench(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "bench/run.py", *arguments]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_the_harness_reports_every_scenario_of_every_target(database_url):
    arguments = ["--requests", "6", "--rounds", "1", "--concurrency", str(CONCURRENCY)]
    targets = ["floor", "gateway-sqlite"]
    if database_url.startswith("postgresql"):
        arguments += ["--database-url", database_url]
        targets.append("gateway-pg")

    done = run_bench(*arguments, "--streams", "8")

    assert done.returncode == 0, done.stderr[-3000:]
    throughput = table_rows(done.stdout, 15)
    expected = {
        (scenario.name, target) for scenario in scenarios(CONCURRENCY) for target in targets
    }
    assert {(row[0], row[1]) for row in throughput} == expected
    assert len(throughput) == len(expected)
    for row in throughput:
        assert row[-1] == "0", row
        assert float(row[2].replace(",", "")) >= 0 and float(row[4]) > 0
        assert 50 <= int(row[-2].rstrip("%")) <= 100, row
    memory = table_rows(done.stdout.split("\n\n", 1)[1], 6)
    assert [(row[0], row[1]) for row in memory] == [("floor", "8"), ("gateway-sqlite", "8")]
    assert_machine_speed_reported(done.stdout)


def assert_machine_speed_reported(output: str) -> None:
    """Check the run's last line: the speed loop's CPU seconds, before and after."""
    last = output.strip().splitlines()[-1]
    match = re.fullmatch(
        r"machine speed: 10,000,000 Python additions took (\d+\.\d\d) s of CPU "
        r"before the run, (\d+\.\d\d) s after",
        last,
    )
    assert match, last
    assert all(float(seconds) > 0 for seconds in match.groups())


def test_the_speed_loop_takes_longer_for_more_additions():
    # A fixed amount of work: ten times the additions takes several times the CPU.
    assert python_loop_seconds(2_000_000) > 3 * python_loop_seconds(200_000) > 0


def test_the_busiest_worker_share_is_of_what_the_workers_used_meanwhile():
    before = {101: 500, 102: 900}
    assert busiest_share(before, {101: 530, 102: 1000}) == 100 / 130
    assert busiest_share(before, {101: 600, 102: 1000}) == 0.5
    # A worker that started meanwhile counts from zero; none used anything: one did it all.
    assert busiest_share(before, {101: 500, 102: 900, 103: 20}) == 1.0
    assert busiest_share(before, before) == 1.0


def test_a_ratio_to_a_floor_that_measured_nothing_is_a_dash():
    # A handful of requests can use less than one clock tick of the floor's CPU.
    assert ratio(3.0, 0.0) == "-"
    assert ratio(3.0, 2.0) == "1.50"


def test_the_instruction_counter_counts_every_target():
    command = [sys.executable, "bench/instructions.py", "--requests", "2", "--api", "messages"]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    counted = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()[1:]}
    assert set(counted) == {"floor", "gateway", "messages"}
    assert "x the chat completion" in done.stdout.splitlines()[-1]
    # Millions of instructions per request: more than zero, so counting was switched on.
    assert all(float(value.rstrip("M")) > 0.5 for value in counted.values()), done.stdout


def test_the_instruction_counter_counts_postgresql_backends_apart_and_in_the_sum():
    command = [sys.executable, "bench/instructions.py", "--requests", "3", "--postgresql"]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)

    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "PostgreSQL (a private server under callgrind, its backends counted)" in lines[0]
    counted = {line.split()[0]: float(line.split()[1].rstrip("M")) for line in lines[1:]}
    assert set(counted) == {"floor", "gateway", "gateway:db", "gateway:sum"}
    # A backend's statements (a hold and a settlement) take well over 100K instructions:
    # fewer would mean the marks counted nothing, or only their own logging.
    assert counted["gateway:db"] > 0.1, done.stdout
    assert abs(counted["gateway:sum"] - counted["gateway"] - counted["gateway:db"]) <= 0.011
    assert "connections" in lines[3] and "background processes" in lines[3]


def test_the_sqlite_replay_times_every_way_of_committing():
    command = [sys.executable, "bench/sqlite_writes.py", "--requests", "5"]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    rows = table_rows(done.stdout, 3)
    assert [row[0] for row in rows] == ["two", "one", "batch 8", "batch 32"]
    assert all(float(row[1].replace(",", "")) > 0 for row in rows)
    assert all(float(row[2].replace(",", "")) > 0 for row in rows)
