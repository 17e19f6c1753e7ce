"""Two versions of the gateway side by side in one run: what a change moved, beyond the noise.

bench/run.py's figures vary by 20% or more from one run to the next on this machine,
more than most changes move them. Here the floor, the gateway at ``--base`` (a commit,
checked out in a temporary git worktree) and the gateway of the working tree serve the
same fake upstream at the same time, each on a database of its own (SQLite, or with
``--database-url`` a PostgreSQL database created for it on that server and dropped
afterwards), and interleaved rounds of the chosen scenarios measure each in turn. For
each scenario it prints each target's CPU per request and req/s as ratios to the
floor's in the same round, and what it adds to the floor's time to first byte: the
median, then every round's value; and the busiest worker's share per round (a round
whose connections all landed on one worker stands out). On PostgreSQL the database
server's CPU, read while each target runs alone, is added to that target's own in a
column of its own (the gateway and its database against the floor, which has none).

    .venv/bin/python bench/compare.py --base COMMIT [--scenario NAME ...] [--rounds 5]
        [--database-url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench.run import (  # noqa: E402
    Figures,
    Gateway,
    Scenario,
    Target,
    bench_catalog,
    free_port,
    machine_speed_line,
    measure_rounds,
    python_loop_seconds,
    raise_open_files_limit,
    running,
    scenarios,
    start_floor,
    start_gateway,
    upstream_command,
)
from config.settings import normalize_database_url  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Serve the floor and both gateways; measure the rounds; print the table."""
    args = parse_args(argv)
    plan = chosen_scenarios(args)
    raise_open_files_limit()
    speed_before = python_loop_seconds()
    with tempfile.TemporaryDirectory(prefix="compare-") as folder, ExitStack() as stack:
        scratch = Path(folder)
        base = stack.enter_context(worktree(args.base, scratch / "base"))
        port = free_port()
        upstream = stack.enter_context(
            running(upstream_command(port), dict(os.environ), port, scratch / "upstream.log")
        )
        gateways = {f"base {args.base}": base, "working tree": ROOT}
        databases = [
            stack.enter_context(database(args.database_url, scratch, index))
            for index in range(len(gateways))
        ]
        targets = start(stack, scratch, port, gateways, databases)
        rounds = measure_rounds(targets, plan, args, upstream.pid)
    print("\n".join(table(rounds, plan, [target.name for target in targets])))
    print(f"\n{machine_speed_line(speed_before, python_loop_seconds())}")
    failed = sum(figures.errors for values in rounds.values() for figures in values)
    return 1 if failed else 0


@contextmanager
def worktree(commit: str, path: Path) -> Iterator[Path]:
    """Check ``commit`` out at ``path`` for the block's length."""
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", str(path), commit], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run([*git, "remove", "--force", str(path)], capture_output=True)


@contextmanager
def database(server_url: str | None, scratch: Path, index: int) -> Iterator[str]:
    """Yield the URL of a fresh database for the ``index``-th gateway, gone afterwards."""
    if server_url is None:
        yield f"sqlite:///{scratch}/gateway-{index}.sqlite3"
        return
    url = make_url(normalize_database_url(server_url))
    name = f"bench_compare_{os.getpid()}_{index}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def start(
    stack: ExitStack,
    scratch: Path,
    upstream_port: int,
    gateways: dict[str, Path],
    databases: list[str],
) -> list[Target]:
    """Start the floor and each gateway (name: its checkout, on its database); return them."""
    targets = [start_floor(stack, scratch, upstream_port)]
    catalog = bench_catalog(scratch, upstream_port)
    for (name, root), url in zip(gateways.items(), databases, strict=True):
        gateway = Gateway(name, url, catalog, root=root)
        targets.append(start_gateway(stack, scratch, gateway))
    return targets


def table(
    rounds: dict[tuple[str, str], list[Figures]], plan: list[Scenario], names: list[str]
) -> list[str]:
    """Render each target against the floor of the same round: median, then each round.

    CPU and req/s as ratios to the floor's; the time to first byte (p50) as what it adds;
    CPU with the database server's beside it, as a ratio to the floor's CPU.
    """
    lines = [
        "| scenario | target | CPU x floor | rounds | req/s % of floor | rounds "
        "| TTFB vs floor ms | rounds | CPU with database x floor | rounds "
        "| busiest worker per round | errors |",
        "|---|---|---:|---|---:|---|---:|---|---:|---|---|---:|",
    ]
    for scenario in plan:
        floor = rounds[scenario.name, "floor"]
        for name in names:
            own = rounds[scenario.name, name]
            cpu = ratios(own, floor, "cpu_us")
            rps = [None if share is None else 100 * share for share in ratios(own, floor, "rps")]
            ttfb = [mine.ttfb_ms - theirs.ttfb_ms for mine, theirs in zip(own, floor, strict=True)]
            with_database = ratios(own, floor, "cpu_with_database_us")
            lines.append(
                f"| {scenario.name} | {name} | {shown(median(cpu), '{:.2f}')} | "
                f"{' '.join(shown(value, '{:.2f}') for value in cpu)} | "
                f"{shown(median(rps), '{:.0f}%')} | "
                f"{' '.join(shown(value, '{:.0f}') for value in rps)} | "
                f"{shown(median(ttfb), '{:+.2f}')} | "
                f"{' '.join(shown(value, '{:+.2f}') for value in ttfb)} | "
                f"{shown(median(with_database), '{:.2f}')} | "
                f"{' '.join(shown(value, '{:.2f}') for value in with_database)} | "
                f"{' '.join(f'{100 * figures.busiest_worker:.0f}%' for figures in own)} | "
                f"{sum(figures.errors for figures in own)} |"
            )
    return lines


def ratios(own: list[Figures], floor: list[Figures], figure: str) -> list[float | None]:
    """Return ``figure``'s ratio to the floor's CPU or req/s, round by round.

    None where the floor measured 0: CPU is read in ticks of 10 ms, and a round of a few
    requests may measure none. ``cpu_with_database_us`` is compared with the floor's CPU.
    """
    per_floor = "cpu_us" if figure == "cpu_with_database_us" else figure
    return [
        value(mine, figure) / getattr(theirs, per_floor) if getattr(theirs, per_floor) else None
        for mine, theirs in zip(own, floor, strict=True)
    ]


def value(figures: Figures, figure: str) -> float:
    """Return one figure of a round; ``cpu_with_database_us`` adds the server's CPU to its own."""
    if figure == "cpu_with_database_us":
        return figures.cpu_us + figures.database_cpu_us
    return getattr(figures, figure)


def median(values: list[float | None]) -> float | None:
    """Return the median of the values measured, None if there are none."""
    measured = [value for value in values if value is not None]
    return statistics.median(measured) if measured else None


def shown(value: float | None, form: str) -> str:
    """Format ``value``, or a dash for one that could not be measured."""
    return "-" if value is None else form.format(value)


def chosen_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """Return bench/run.py's scenarios named by ``--scenario`` (all if none), in its order."""
    plan = scenarios(args.concurrency)
    if not args.scenario:
        return plan
    unknown = set(args.scenario) - {scenario.name for scenario in plan}
    if unknown:
        sys.exit(f"unknown scenarios {sorted(unknown)}; known: {[s.name for s in plan]}")
    return [scenario for scenario in plan if scenario.name in args.scenario]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--scenario", action="append", help="a scenario of bench/run.py")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=600, help="per scenario and round")
    parser.add_argument("--concurrency", type=int, default=64, help="the busy scenarios'")
    parser.add_argument(
        "--database-url", help="a PostgreSQL server (any database): each gateway gets one there"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
