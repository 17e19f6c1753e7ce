"""The gateway's cost against the floor, measured from outside, as users run it.

Every target sits in front of the same fake upstream (bench/fake_upstream.py), under
gunicorn with gevent workers as the Procfile runs it: the floor (bench/floor_app.py, a
bare Flask view forwarding the body), the gateway on SQLite and, with
``--database-url``, the gateway on PostgreSQL (APP_ENV=production, its rate limit on
but far above the load). Rounds are interleaved (each scenario: floor, gateway-sqlite,
gateway-pg; then the next scenario; then the next round) and every figure is the median
of the rounds, with its ratio to the floor's figure of the same run. CPU is the server's
whole process tree (master and workers, utime + stime from /proc) before and after each
scenario; the local PostgreSQL server's processes are measured apart, since on
PostgreSQL part of a request's work is theirs. Then the memory benchmark: ``--streams``
streams held open against one gevent worker of the floor and of the gateway (SQLite),
RSS per open stream.

    .venv/bin/python bench/run.py [--database-url postgresql://...] [--requests 600]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.load import close_streams, open_streams, send_requests  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
# Each server: gunicorn worker processes, and gevent connections per worker.
WORKERS, CONNECTIONS = 2, 1000
PROMPT = [{"role": "user", "content": "Say hello in twenty words, one at a time."}]
# A fixed piece of Python work timed before and after a run: this machine kind's speed
# varies from day to day (the same loop has taken 0.57 s on a quiet day, 1.7 s on a
# slowed one), which moves every absolute figure and the ratios with them; the line
# says which kind of day a run's figures come from.
SPEED_PROBE_ADDITIONS = 10_000_000


@dataclass(frozen=True)
class Scenario:
    """One kind of load: a model of the fake upstream, whole or streamed, how many at once."""

    name: str
    model: str
    streamed: bool
    concurrency: int

    def body(self) -> bytes:
        """Return the request body the client sends."""
        stream = ',"stream":true' if self.streamed else ""
        return (
            f'{{"model":"{self.model}","messages":[{{"role":"user","content":'
            f'"{PROMPT[0]["content"]}"}}],"max_tokens":64{stream}}}'
        ).encode()


@dataclass
class Target:
    """A server under test: its name, port, gunicorn master and API key (None: the floor)."""

    name: str
    port: int
    process: subprocess.Popen
    key: str | None


@dataclass(frozen=True)
class Figures:
    """What one scenario measured on one target in one round."""

    cpu_us: float
    upstream_cpu_us: float
    database_cpu_us: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    ttfb_ms: float
    rps: float
    # The busiest worker's share of the workers' CPU: near half when the kernel spreads
    # a burst of keep-alive connections over the workers' sockets; a worker serving all
    # of them serves about half of what two would.
    busiest_worker: float
    errors: int


def scenarios(concurrency: int) -> list[Scenario]:
    """Return the scenarios of a run, with ``concurrency`` as the busy case."""
    busy = concurrency
    return [
        Scenario("whole c=1", "bench-fast", False, 1),
        Scenario("stream c=1", "bench-fast", True, 1),
        Scenario("stream c=1, one event per read", "bench-drip", True, 1),
        Scenario(f"whole c={busy}", "bench-fast", False, busy),
        Scenario(f"stream c={busy}", "bench-fast", True, busy),
        Scenario(f"whole c={busy}, 50 ms upstream", "bench-slow", False, busy),
        Scenario(f"stream c={busy}, 50 ms upstream", "bench-slow", True, busy),
    ]


def free_port() -> int:
    """Return a port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_tree(pid: int) -> list[int]:
    """Return ``pid`` and all its descendants."""
    tree, index = [pid], 0
    while index < len(tree):
        parent = tree[index]
        for task in Path(f"/proc/{parent}/task").iterdir():
            try:
                tree.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:
                pass
        index += 1
    return tree


def cpu_ticks(process: Path, *, ended_children: bool = False) -> int:
    """Return the clock ticks of CPU (user + system) a /proc entry has used; 0 if gone.

    With ``ended_children``, also those of its children that ended and it waited for.
    """
    try:
        fields = (process / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    # utime, stime, then cutime, cstime.
    return sum(int(field) for field in fields[11 : 15 if ended_children else 13])


def tree_cpu_seconds(pid: int) -> float:
    """Return the CPU time (user + system) used so far by ``pid``'s process tree."""
    return sum(cpu_ticks(Path(f"/proc/{member}")) for member in process_tree(pid)) / CLOCK_TICKS


def workers_cpu_ticks(master_pid: int) -> dict[int, int]:
    """Return the CPU clock ticks each of a gunicorn master's workers has used so far."""
    return {pid: cpu_ticks(Path(f"/proc/{pid}")) for pid in process_tree(master_pid)[1:]}


def busiest_share(before: dict[int, int], after: dict[int, int]) -> float:
    """Return the largest worker's share of the CPU its workers used between two readings."""
    used = [ticks - before.get(pid, 0) for pid, ticks in after.items()]
    total = sum(used)
    return max(used) / total if total > 0 else 1.0


def database_cpu_seconds() -> float:
    """Return the CPU time used so far by this machine's PostgreSQL server processes.

    A backend that exits (its connection closed) leaves its time to the server's main
    process, which counts its ended children's: both are summed.
    """
    total = 0
    for entry in Path("/proc").iterdir():
        try:
            is_postgres = entry.name.isdigit() and (entry / "comm").read_text().startswith(
                "postgres"
            )
        except OSError:
            continue
        if is_postgres:
            total += cpu_ticks(entry, ended_children=True)
    return total / CLOCK_TICKS


def rss_kb(pid: int) -> int:
    """Return the resident set size of one process in KB."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB


def wait_until_listening(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until something accepts connections on ``port``; fail if ``process`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


@contextmanager
def running(
    command: list[str], env: dict[str, str], port: int, log: Path, *, root: Path = ROOT
) -> Iterator:
    """Run ``command`` in ``root`` until the block ends; yield the process once it listens."""
    with open(log, "ab") as output:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=output, stderr=output)
    try:
        wait_until_listening(port, process)
        yield process
    finally:
        # SIGINT is gunicorn's quick shutdown; held streams need no grace.
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def gunicorn(config: str, app: str) -> list[str]:
    """Return the command that serves ``app`` as the Procfile does."""
    return [sys.executable, "-m", "gunicorn", "-c", config, app]


def base_env(port: int, workers: int, connections: int, *, root: Path = ROOT) -> dict[str, str]:
    """Return the environment every server shares (serving the code in ``root``)."""
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "PORT": str(port),
        "WEB_CONCURRENCY": str(workers),
        "WORKER_CONNECTIONS": str(connections),
    }


def gateway_env(database_url: str, catalog: Path) -> dict[str, str]:
    """Return the gateway's production settings for one database."""
    return {
        "APP_ENV": "production",
        "FLASK_APP": "wsgi",
        "SECRET_KEY": secrets.token_hex(32),
        "DATABASE_URL": database_url,
        "MODEL_CATALOG": str(catalog),
        # Counted on every request like any limit, but never reached by the benchmark.
        "RATE_LIMIT": "100000000 per minute",
    }


def funded_key(env: dict[str, str], *, root: Path = ROOT) -> str:
    """Migrate the gateway's database (``root``'s code); create a funded account; return a key."""
    flask = [sys.executable, "-m", "flask"]
    email = f"bench-{time.time_ns()}@example.com"
    commands = [
        ["db", "upgrade"],
        ["accounts", "create", email, "--credits", "100000"],
        ["keys", "create", email, "--name", "bench"],
    ]
    for command in commands:
        done = subprocess.run([*flask, *command], cwd=root, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"flask {' '.join(command[:2])}: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def bench_catalog(scratch: Path, upstream_port: int) -> Path:
    """Write bench/models.toml with the fake upstream's port; return its path."""
    text = (ROOT / "bench" / "models.toml").read_text()
    catalog = scratch / "models.toml"
    catalog.write_text(text.replace("127.0.0.1:9100", f"127.0.0.1:{upstream_port}"))
    return catalog


def start_targets(
    stack: ExitStack, args: argparse.Namespace, scratch: Path, upstream_port: int,
    *, workers: int = WORKERS, connections: int = CONNECTIONS, databases: dict[str, str],
) -> list[Target]:  # fmt: skip
    """Start the floor and a gateway per database; return them once they listen."""
    targets = [start_floor(stack, scratch, upstream_port, workers, connections)]
    catalog = bench_catalog(scratch, upstream_port)
    for name, url in databases.items():
        gateway = Gateway(name, url, catalog, workers, connections)
        targets.append(start_gateway(stack, scratch, gateway))
    return targets


def start_floor(
    stack: ExitStack,
    scratch: Path,
    upstream_port: int,
    workers: int = WORKERS,
    connections: int = CONNECTIONS,
) -> Target:
    """Start the floor in front of the upstream; return it once it listens."""
    port = free_port()
    env = base_env(port, workers, connections)
    env["BENCH_UPSTREAM_URL"] = f"http://127.0.0.1:{upstream_port}/v1/chat/completions"
    command = gunicorn("bench/floor.gunicorn.conf.py", "bench.floor_app:app")
    process = stack.enter_context(running(command, env, port, scratch / "floor.log"))
    return Target("floor", port, process, None)


@dataclass(frozen=True)
class Gateway:
    """A gateway to serve: its name in the tables, database, catalog, and checkout."""

    name: str
    database_url: str
    catalog: Path
    workers: int = WORKERS
    connections: int = CONNECTIONS
    root: Path = ROOT


def start_gateway(stack: ExitStack, scratch: Path, gateway: Gateway) -> Target:
    """Migrate and fund the gateway's database, serve it; return it once it listens."""
    port = free_port()
    env = {
        **base_env(port, gateway.workers, gateway.connections, root=gateway.root),
        **gateway_env(gateway.database_url, gateway.catalog),
    }
    key = funded_key(env, root=gateway.root)
    command = gunicorn("config/gunicorn.conf.py", "wsgi:app")
    log = scratch / f"{gateway.name.replace(' ', '-')}.log"
    process = stack.enter_context(running(command, env, port, log, root=gateway.root))
    return Target(gateway.name, port, process, key)


def percentile(values: list[float], fraction: float) -> float:
    """Return the value below which ``fraction`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def measure(target: Target, scenario: Scenario, count: int, upstream_pid: int) -> Figures:
    """Run ``count`` requests of ``scenario`` against ``target``; return its figures."""
    cpu_before = tree_cpu_seconds(target.process.pid)
    upstream_before = tree_cpu_seconds(upstream_pid)
    database_before = database_cpu_seconds()
    workers_before = workers_cpu_ticks(target.process.pid)
    timings = asyncio.run(
        send_requests(
            target.port, scenario.body(), target.key, count=count,
            concurrency=scenario.concurrency, streamed=scenario.streamed,
        )
    )  # fmt: skip
    cpu = tree_cpu_seconds(target.process.pid) - cpu_before
    upstream_cpu = tree_cpu_seconds(upstream_pid) - upstream_before
    database_cpu = database_cpu_seconds() - database_before
    busiest = busiest_share(workers_before, workers_cpu_ticks(target.process.pid))
    if timings.errors:
        print(f"{target.name} {scenario.name}: {timings.errors[0]}", file=sys.stderr)
    answered = len(timings.latencies)
    return Figures(
        cpu_us=cpu * 1e6 / answered,
        upstream_cpu_us=upstream_cpu * 1e6 / answered,
        database_cpu_us=database_cpu * 1e6 / answered,
        p50_ms=percentile(timings.latencies, 0.5) * 1000,
        p90_ms=percentile(timings.latencies, 0.9) * 1000,
        p99_ms=percentile(timings.latencies, 0.99) * 1000,
        ttfb_ms=percentile(timings.first_bytes, 0.5) * 1000,
        rps=answered / timings.elapsed,
        busiest_worker=busiest,
        errors=len(timings.errors),
    )


def warm_up(targets: list[Target], plan: list[Scenario], upstream_pid: int) -> None:
    """Send each target a few requests of each scenario: imports, pools, caches."""
    for target in targets:
        for scenario in plan:
            measure(target, scenario, min(scenario.concurrency * 2, 64), upstream_pid)


def measure_rounds(
    targets: list[Target], plan: list[Scenario], args: argparse.Namespace, upstream_pid: int
) -> dict[tuple[str, str], list[Figures]]:
    """Warm the targets up; measure ``args.rounds`` interleaved rounds of each scenario.

    Return each (scenario, target)'s figures, a round each.
    """
    warm_up(targets, plan, upstream_pid)
    rounds: dict[tuple[str, str], list[Figures]] = {}
    for _ in range(args.rounds):
        for scenario in plan:
            for target in targets:
                figures = measure(target, scenario, args.requests, upstream_pid)
                rounds.setdefault((scenario.name, target.name), []).append(figures)
    return rounds


def median_figures(rounds: list[Figures]) -> Figures:
    """Return the median of each figure over the rounds (errors: their sum)."""
    medians = {
        name: statistics.median(getattr(figures, name) for figures in rounds)
        for name in Figures.__dataclass_fields__
        if name != "errors"
    }
    return Figures(**medians, errors=sum(figures.errors for figures in rounds))


def python_loop_seconds(additions: int = SPEED_PROBE_ADDITIONS) -> float:
    """Return the CPU seconds this process takes to add up ``additions`` integers in Python."""
    started = time.process_time()
    total = 0
    for number in range(additions):
        total += number
    return time.process_time() - started


def machine_speed_line(before: float, after: float) -> str:
    """Say how fast the machine ran, measured by the same loop before and after a run."""
    return (
        f"machine speed: {SPEED_PROBE_ADDITIONS:,} Python additions took {before:.2f} s of CPU "
        f"before the run, {after:.2f} s after"
    )


def ratio(own: float, floor: float) -> str:
    """Format ``own / floor``; a dash when the floor measured nothing (too few requests)."""
    return f"{own / floor:.2f}" if floor else "-"


def throughput_rows(results: dict[tuple[str, str], Figures], plan, targets) -> list[str]:
    """Render the throughput table, each figure beside its ratio to the floor's."""
    rows = [
        "| scenario | target | CPU us/req | x floor | p50 ms | p90 ms | p99 ms | TTFB p50 ms "
        "| TTFB vs floor ms | req/s | % of floor | upstream CPU us/req | PostgreSQL CPU us/req "
        "| busiest worker | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario in plan:
        floor = results[scenario.name, "floor"]
        for target in targets:
            own = results[scenario.name, target.name]
            rows.append(
                f"| {scenario.name} | {target.name} | {own.cpu_us:,.0f} | "
                f"{ratio(own.cpu_us, floor.cpu_us)} | {own.p50_ms:.2f} | {own.p90_ms:.2f} | "
                f"{own.p99_ms:.2f} | {own.ttfb_ms:.2f} | {own.ttfb_ms - floor.ttfb_ms:+.2f} | "
                f"{own.rps:,.0f} | {100 * own.rps / floor.rps:.0f}% | "
                f"{own.upstream_cpu_us:,.0f} | {own.database_cpu_us:,.0f} | "
                f"{100 * own.busiest_worker:.0f}% | {own.errors} |"
            )
    return rows


def run_throughput(
    args: argparse.Namespace, scratch: Path, upstream: Target
) -> tuple[list[str], int]:
    """Serve every target, run the interleaved rounds; return the table and failed requests."""
    databases = {"gateway-sqlite": f"sqlite:///{scratch}/bench.sqlite3"}
    if args.database_url:
        databases["gateway-pg"] = args.database_url
    plan = scenarios(args.concurrency)
    with ExitStack() as stack:
        targets = start_targets(stack, args, scratch, upstream.port, databases=databases)
        rounds = measure_rounds(targets, plan, args, upstream.process.pid)
    results = {key: median_figures(values) for key, values in rounds.items()}
    errors = sum(figures.errors for figures in results.values())
    return throughput_rows(results, plan, targets), errors


def worker_of(master: subprocess.Popen, timeout: float = 30) -> int:
    """Return the pid of a gunicorn master's only worker, once it has forked it."""
    deadline = time.monotonic() + timeout
    # The master listens before its worker boots.
    while len(tree := process_tree(master.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    if len(tree) < 2:
        raise RuntimeError(f"gunicorn {master.pid} started no worker")
    return tree[1]


def hold_streams(target: Target, count: int) -> tuple[int, int, int]:
    """Open ``count`` slow streams; return (streams open, RSS before, RSS open) in KB."""
    body = Scenario("memory", "bench-trickle", True, 1).body()
    worker = worker_of(target.process)

    async def held() -> tuple[int, int, int]:
        # Warm the worker's pools and lazy imports first, so they are not counted.
        await close_streams(await open_streams(target.port, body, target.key, count=50))
        await asyncio.sleep(1)
        idle = rss_kb(worker)
        writers = await open_streams(target.port, body, target.key, count=count)
        await asyncio.sleep(1)
        loaded = rss_kb(worker)
        await close_streams(writers)
        return len(writers), idle, loaded

    return asyncio.run(held())


def run_memory(args: argparse.Namespace, scratch: Path, upstream: Target) -> list[str]:
    """Hold ``--streams`` streams on one worker of the floor and the gateway; RSS each."""
    databases = {"gateway-sqlite": f"sqlite:///{scratch}/memory.sqlite3"}
    rows = [
        "| target | streams open | worker RSS idle MB | RSS with streams MB | KB per stream "
        "| x floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    with ExitStack() as stack:
        targets = start_targets(
            stack, args, scratch, upstream.port, workers=1,
            connections=args.streams + 100, databases=databases,
        )  # fmt: skip
        measured = [hold_streams(target, args.streams) for target in targets]
    floor_per_stream = None
    for target, (opened, idle, loaded) in zip(targets, measured, strict=True):
        per_stream = (loaded - idle) / max(opened, 1)
        floor_per_stream = per_stream if floor_per_stream is None else floor_per_stream
        rows.append(
            f"| {target.name} | {opened:,} | {idle / 1024:.1f} | {loaded / 1024:.1f} | "
            f"{per_stream:.1f} | {ratio(per_stream, floor_per_stream)} |"
        )
    return rows


def raise_open_files_limit(streams: int = 0) -> None:
    """Let this process and the servers it starts hold as many sockets as allowed."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # The gateway's worker holds two sockets per open stream: the caller's and the upstream's.
    if hard != resource.RLIM_INFINITY and hard < 2 * streams + 500:
        print(f"warning: ulimit -Hn is {hard}; {streams} streams need {2 * streams + 500}",
              file=sys.stderr)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="PostgreSQL URL: also measure the gateway on it")
    parser.add_argument("--requests", type=int, default=600, help="per scenario and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64, help="the busy scenarios'")
    parser.add_argument("--streams", type=int, default=9000, help="memory: 0 skips it")
    return parser.parse_args(argv)


def upstream_command(port: int) -> list[str]:
    """Return the command that serves the fake upstream on ``port``."""
    return [sys.executable, str(ROOT / "bench" / "fake_upstream.py"), "--port", str(port)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print its tables; return 1 if any request failed."""
    args = parse_args(argv)
    raise_open_files_limit(args.streams)
    speed_before = python_loop_seconds()
    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    port, log = free_port(), scratch / "upstream.log"
    with running(upstream_command(port), dict(os.environ), port, log) as process:
        upstream = Target("upstream", port, process, None)
        lines, errors = run_throughput(args, scratch, upstream)
        if args.streams:
            lines += ["", *run_memory(args, scratch, upstream)]
    lines += ["", machine_speed_line(speed_before, python_loop_seconds())]
    print("\n".join(lines))
    print(f"server logs: {scratch}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
