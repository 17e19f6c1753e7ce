"""The hot account: one balance paid from by many keys at once, against many balances.

On PostgreSQL, c connections (64) against the 50 ms upstream send whole answers, each
connection with its own key: in one scenario the 64 keys belong to ONE account, in the
other to 64 accounts. Both are served by a gateway of 1 worker and one of 2 (the same
database), and the rounds are interleaved (w=1 one account, w=1 64 accounts, w=2 ...,
then the next round), so that the ratios compare figures measured side by side on a
shared machine. Reported: req/s, the gateway's and PostgreSQL's CPU per request (medians
of the rounds), one account's req/s as a share of 64 accounts', and 2 workers' over 1.

    .venv/bin/python bench/hot_account.py --database-url postgresql://postgres@127.0.0.1:5432/bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402
    CONNECTIONS,
    Figures,
    Scenario,
    Target,
    base_env,
    bench_catalog,
    free_port,
    gateway_env,
    gunicorn,
    machine_speed_line,
    measure,
    python_loop_seconds,
    running,
    upstream_command,
)

# Run by the gateway's own Python with its environment: migrate, then create the accounts
# (funded) and their keys through the project's own functions; print the keys' values.
FUND = """
import json, sys
from decimal import Decimal
from flask_migrate import upgrade
from wsgi import app
from app.accounts.keys import create_key
from app.credits import grants
from app.accounts.organisations import create_account
accounts, keys_each, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with app.app_context():
    upgrade()
    values = []
    for number in range(accounts):
        account = create_account(email=f"hot-{tag}-{number}@example.com")
        grants.grant_credits(account_id=account.id, amount=Decimal(100000), description="bench")
        for each in range(keys_each):
            values.append(create_key(account_id=account.id, name=f"bench {each}").value)
print(json.dumps(values))
"""


@dataclass(frozen=True)
class Payers:
    """A way to spread the load's keys: its name and the keys' values."""

    name: str
    keys: list[str]


def funded_keys(env: dict[str, str], accounts: int, keys_each: int, tag: str) -> list[str]:
    """Create ``accounts`` funded accounts of ``keys_each`` keys each; return the keys."""
    done = subprocess.run(
        [sys.executable, "-c", FUND, str(accounts), str(keys_each), tag],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"funding the bench's accounts: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_gateway(stack: ExitStack, scratch: Path, env: dict[str, str], workers: int) -> Target:
    """Serve the gateway with ``workers`` workers; return it once it listens."""
    port = free_port()
    env = {**env, **base_env(port, workers, CONNECTIONS)}
    log = scratch / f"gateway-w{workers}.log"
    process = stack.enter_context(
        running(gunicorn("config/gunicorn.conf.py", "wsgi:app"), env, port, log)
    )
    return Target(f"w={workers}", port, process, None)


def measure_payers(
    target: Target, scenario: Scenario, payers: Payers, count: int, upstream_pid: int
) -> Figures:
    """Measure ``count`` requests of ``scenario`` on ``target``, sent with ``payers``' keys."""
    return measure(
        Target(target.name, target.port, target.process, payers.keys), scenario, count, upstream_pid
    )


def table(
    results: dict[tuple[str, str], list[Figures]], targets: list[Target], spreads: list[Payers]
) -> list[str]:
    """Render the medians, the one-account share and the workers' growth."""
    rows = [
        "| workers | keys of | req/s | gateway CPU us/req | PostgreSQL CPU us/req "
        "| p50 ms | p99 ms | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    medians: dict[tuple[str, str], float] = {}
    for target in targets:
        for payers in spreads:
            rounds = results[target.name, payers.name]
            rps = statistics.median(figures.rps for figures in rounds)
            medians[target.name, payers.name] = rps
            rows.append(
                f"| {target.name} | {payers.name} | {rps:,.0f} | "
                f"{statistics.median(f.cpu_us for f in rounds):,.0f} | "
                f"{statistics.median(f.database_cpu_us for f in rounds):,.0f} | "
                f"{statistics.median(f.p50_ms for f in rounds):.1f} | "
                f"{statistics.median(f.p99_ms for f in rounds):.1f} | "
                f"{sum(f.errors for f in rounds)} |"
            )
    one, many = spreads[0].name, spreads[1].name
    rows.append("")
    for target in targets:
        shares = [
            a.rps / b.rps
            for a, b in zip(results[target.name, one], results[target.name, many], strict=True)
        ]
        rows.append(
            f"{target.name}: one account's req/s / 64 accounts', per round: "
            + ", ".join(f"{share:.0%}" for share in shares)
            + f"; median {statistics.median(shares):.0%}"
        )
    if len(targets) == 2:
        growth = [
            b.rps / a.rps
            for a, b in zip(
                results[targets[0].name, one], results[targets[1].name, one], strict=True
            )
        ]
        rows.append(
            f"one account, {targets[1].name} / {targets[0].name} req/s, per round: "
            + ", ".join(f"{value:.2f}" for value in growth)
            + f"; median {statistics.median(growth):.2f}"
        )
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", required=True, help="PostgreSQL's (or sqlite:///..., for its ceiling)"
    )
    parser.add_argument("--requests", type=int, default=1000, help="per scenario and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--model", default="bench-slow", help="bench-fast: an upstream that answers at once"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved rounds; print the table; return 1 if any request failed."""
    args = parse_args(argv)
    speed_before = python_loop_seconds()
    scratch = Path(tempfile.mkdtemp(prefix="bench-hot-"))
    upstream_kind = "50 ms upstream" if args.model == "bench-slow" else args.model
    scenario = Scenario(
        f"whole c={args.concurrency}, {upstream_kind}", args.model, False, args.concurrency
    )
    port = free_port()
    with ExitStack() as stack:
        upstream = stack.enter_context(
            running(upstream_command(port), dict(os.environ), port, scratch / "upstream.log")
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            **gateway_env(args.database_url, bench_catalog(scratch, port)),
        }
        tag = str(os.getpid())
        spreads = [
            Payers("one account", funded_keys(env, 1, args.concurrency, f"{tag}-one")),
            Payers(
                f"{args.concurrency} accounts", funded_keys(env, args.concurrency, 1, f"{tag}-many")
            ),
        ]
        targets = [start_gateway(stack, scratch, env, workers) for workers in args.workers]
        for target in targets:
            for payers in spreads:
                measure_payers(target, scenario, payers, args.concurrency * 4, upstream.pid)
        results: dict[tuple[str, str], list[Figures]] = {}
        for _ in range(args.rounds):
            for target in targets:
                for payers in spreads:
                    figures = measure_payers(target, scenario, payers, args.requests, upstream.pid)
                    results.setdefault((target.name, payers.name), []).append(figures)
    lines = [
        f"{scenario.name}, {args.rounds} rounds of {args.requests}",
        "",
        *table(results, targets, spreads),
    ]
    lines += ["", machine_speed_line(speed_before, python_loop_seconds())]
    print("\n".join(lines))
    print(f"server logs: {scratch}", file=sys.stderr)
    failed = any(f.errors for rounds in results.values() for f in rounds)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
