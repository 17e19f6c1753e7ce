"""Where the gateway's CPU goes per request, by component, through an HTTP upstream.

Serves the gateway (one gevent worker, production settings) in front of the fake
upstream, keeps it busy, and samples the worker with py-spy. Each sample is charged to
the innermost frame that names a component (auth lookup, rate limiter, schema
validation, prompt token counting, hold, upstream call, settlement, access log...), so
that the worker's measured CPU per request splits into what each component costs.
``--floor`` samples the floor (bench/floor_app.py) instead, to set beside it.
py-spy is a tool, not a dependency: ``.venv/bin/pip install py-spy`` first.

    .venv/bin/python bench/profile.py [--database-url URL] [--stream] [--seconds 20] [--floor]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.load import send_requests  # noqa: E402
from bench.run import (  # noqa: E402
    Scenario,
    free_port,
    raise_open_files_limit,
    running,
    start_targets,
    tree_cpu_seconds,
    upstream_command,
    worker_of,
)

# (component, what its innermost frame contains), most specific first within a stack.
COMPONENTS = [
    ("access log", ("glogging.py",)),
    ("rate limiter", ("flask_limiter", "/limits/", "app/ratelimits.py")),
    ("auth lookup", ("app/auth/",)),
    ("idempotency check", ("app/completions/decorators.py",)),
    ("request body parsing", ("app/request_body.py",)),
    ("schema validation", ("app/completions/schemas.py",)),
    ("prompt token counting (hold)", ("app/providers/tokens.py", "count_prompt_tokens")),
    ("hold", ("place_hold (", "_try_place_hold (")),
    ("settlement", ("finish_generation (", "settle_hold (", "generation_record (")),
    ("adapter request building", ("request_body (", "headers (app/providers/openai")),
    ("JSON encoding/decoding", ("app/encoding.py",)),
    (
        "upstream call",
        (
            "post (app/providers/transport.py",
            "exchange (app/providers/transport.py",
            "post (app/providers/http1.py",
        ),
    ),
    (
        "response handling",
        ("app/providers/openai_compat.py", "app/providers/transport.py", "app/completions/"),
    ),
    ("app logging", ("logging/__init__.py",)),
]
FRAMEWORK = "gunicorn, gevent, werkzeug, flask, other"


def component_of(stack: list[str]) -> str:
    """Return the component of one sampled stack (frames root first)."""
    for frame in reversed(stack):
        for name, markers in COMPONENTS:
            if any(marker in frame for marker in markers):
                return name
    return FRAMEWORK


def read_samples(path: Path) -> Counter[str]:
    """Count py-spy's raw (collapsed) samples by component.

    A record is a stack and its count; a frame's name may span lines (py-spy names some
    frames by an object's repr), so a record ends at the first line ending in a count.
    """
    samples: Counter[str] = Counter()
    record = ""
    for line in path.read_text(errors="replace").splitlines():
        record += line
        stack, _, count = record.rpartition(" ")
        if not count.isdigit():
            continue
        if stack:
            samples[component_of(stack.split(";"))] += int(count)
        record = ""
    return samples


async def keep_busy(target, scenario: Scenario, until: float, concurrency: int) -> int:  # noqa: ANN001
    """Send requests until ``until`` (a monotonic time); return how many were answered."""
    answered = 0
    while time.monotonic() < until:
        timings = await send_requests(
            target.port, scenario.body(), target.key, count=concurrency * 20,
            concurrency=concurrency, streamed=scenario.streamed,
        )  # fmt: skip
        answered += len(timings.latencies) - len(timings.errors)
    return answered


def profile(args: argparse.Namespace, scratch: Path, upstream_port: int) -> None:
    """Serve the gateway (or the floor), sample it under load, print CPU per request."""
    databases = {"gateway": args.database_url or f"sqlite:///{scratch}/profile.sqlite3"}
    scenario = Scenario("profile", "bench-fast", args.stream, args.concurrency)
    with ExitStack() as stack:
        floor, gateway = start_targets(
            stack, args, scratch, upstream_port, workers=1, databases=databases
        )
        target = floor if args.floor else gateway
        worker = worker_of(target.process)
        asyncio.run(keep_busy(target, scenario, time.monotonic() + 3, args.concurrency))
        raw = Path(args.raw) if args.raw else scratch / "profile.txt"
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(worker),
             "--format", "raw", "--rate", "250", "--duration", str(args.seconds),
             "--output", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        before = tree_cpu_seconds(worker)
        until = time.monotonic() + args.seconds
        answered = asyncio.run(keep_busy(target, scenario, until, args.concurrency))
        cpu_us = (tree_cpu_seconds(worker) - before) * 1e6 / answered
        spy.wait()
    print_components(read_samples(raw), cpu_us, answered, scenario)


def print_components(samples: Counter[str], cpu_us: float, answered: int, scenario) -> None:  # noqa: ANN001
    """Print each component's share of the samples and of the CPU per request."""
    total = sum(samples.values()) or 1
    kind = "stream" if scenario.streamed else "whole"
    print(f"worker: {cpu_us:,.0f} us CPU per {kind} request, {answered} requests")
    print("| component | share of samples | us CPU per request |")
    print("|---|---:|---:|")
    for name, count in samples.most_common():
        print(f"| {name} | {100 * count / total:.1f}% | {cpu_us * count / total:,.0f} |")


def main() -> None:
    """Parse the command line and profile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    parser.add_argument("--stream", action="store_true", help="profile 20-chunk streams")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--raw", help="also keep py-spy's raw samples in this file")
    parser.add_argument("--floor", action="store_true", help="profile the floor instead")
    args = parser.parse_args()
    raise_open_files_limit()
    scratch = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    port = free_port()
    with running(upstream_command(port), dict(os.environ), port, scratch / "upstream.log"):
        profile(args, scratch, port)


if __name__ == "__main__":
    main()
