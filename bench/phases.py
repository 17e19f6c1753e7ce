"""Where a billed request's time goes, timed in the request's own flow.

bench/profile.py charges each sample to the library it lands in, and bench/instructions.py
counts instructions; neither says what one step of the request costs as it runs among
the others, with the caches the rest of the request leaves it. Here the gateway (the
production app, gevent-patched, metrics in multiprocess mode) serves ``--requests``
whole answers (or streams) one after the other in this process, in front of the fake
upstream, called as a WSGI app as bench/instructions.py calls it, and each step below is
wrapped in a clock (the wall clock: one request at a time, nothing else runs meanwhile,
and a step waits on nothing but the upstream's answer). Steps nest; a step's time
includes the steps under it. Wrapping adds about half a microsecond to each call.
A stream's generation runs as its body is read, outside any step but the ones it calls.
The gateway's log lines go to a file in the scratch directory, as they would go to a pipe.

    .venv/bin/python bench/phases.py [--database-url URL] [--stream] [--requests 3000]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.instructions import call, configure_gateway  # noqa: E402
from bench.run import Scenario, free_port, running, upstream_command  # noqa: E402

# (how deep it nests, what it is, the module whose name the request's code calls it
# by, that name): a step is timed where its caller looks it up.
STEPS = [
    (0, "find the caller", "app.auth.decorators", "find_caller"),
    (1, "look the key up in the database", "app.auth.keys", "_look_up_caller"),
    (0, "decode the body", "app.completions.views", "json_body"),
    (0, "validate the request", "app.completions.views", "parse_chat_request"),
    (0, "start the generation", "app.completions.views", "start_generation"),
    (1, "place the hold", "app.generations.lifecycle", "place_hold"),
    (0, "run the generation (whole)", "app.completions.views", "run_generation"),
    (1, "call the upstream", "app.generations.lifecycle", "complete_on_routes"),
    (1, "finish the generation", "app.generations.lifecycle", "finish_generation"),
    (2, "settle the hold", "app.generations.lifecycle", "settle_hold"),
    (0, "write the access line", "app.observability.middleware", "log_access"),
    (0, "record the metrics", "app.observability.metrics", "observe_request"),
    (0, "SQLite: take the write lock", "app.database.sqlite", "_take_write_lock"),
    (0, "SQLite: run a write's statements", "app.database.sqlite", "_run_write"),
    (0, "database: commit a transaction", "sqlalchemy.engine.base.RootTransaction", "commit"),
    (
        0,
        "database: bind a driver statement's parameters",
        "app.database.driver.DriverForm",
        "arguments",
    ),
    (0, "database: execute a driver statement", "app.database.driver", "driver_cursor"),
]


def timed(function: Callable[..., Any], name: str, spent: Counter, calls: Counter) -> Any:
    """Return ``function`` wrapped to add its wall time and calls to ``spent`` and ``calls``."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - started
            calls[name] += 1

    return wrapper


def owner_of(path: str) -> Any:
    """Return the module (or a class in it, ``module.Class``) that ``path`` names."""
    module, _, attribute = path.rpartition(".")
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        return getattr(importlib.import_module(module), attribute)


def wrap_steps(spent: Counter, calls: Counter) -> None:
    """Wrap every step where its caller looks it up."""
    for _, name, owner, attribute in STEPS:
        holder = owner_of(owner)
        setattr(holder, attribute, timed(getattr(holder, attribute), name, spent, calls))


def serve(args: argparse.Namespace, upstream_port: int, scratch: Path) -> list[str]:
    """Serve the counted requests with every step timed; return the table's lines."""
    key = configure_gateway(scratch, upstream_port, args.database_url)
    log = scratch / "gateway.log"
    with open(log, "w") as sys.stderr:
        try:
            return serve_logged(args, key)
        except RuntimeError as error:
            raise RuntimeError(f"{error} (its log: {log})") from error
        finally:
            sys.stderr = sys.__stderr__


def serve_logged(args: argparse.Namespace, key: str) -> list[str]:
    """Serve the counted requests, the app logging to the current sys.stderr."""
    from wsgi import app

    spent: Counter = Counter()
    calls: Counter = Counter()
    wrap_steps(spent, calls)
    body = Scenario("phases", "bench-fast", args.stream, 1).body()
    for _ in range(args.warm_up):
        call(app, body, key)
    spent.clear()
    calls.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.requests):
        status = call(app, body, key)
        if not status.startswith("200"):
            raise RuntimeError(f"the gateway answered {status}")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return table(args, spent, calls, wall, cpu)


def table(
    args: argparse.Namespace, spent: Counter, calls: Counter, wall: float, cpu: float
) -> list[str]:
    """Render the steps' time per request, nested as they run."""
    count = args.requests
    kind = "stream" if args.stream else "whole answer"
    database = "PostgreSQL" if args.database_url else "SQLite"
    lines = [
        f"{kind}, gateway on {database}, {count} requests one at a time: "
        f"{wall * 1e6 / count:,.0f} us wall, {cpu * 1e6 / count:,.0f} us CPU a request",
        "| step | us a request | calls a request |",
        "|---|---:|---:|",
    ]
    for depth, name, _, _ in STEPS:
        if calls[name]:
            shown = "· " * depth + name
            lines.append(
                f"| {shown} | {spent[name] * 1e6 / count:,.1f} | {calls[name] / count:.1f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run the fake upstream; serve and time the requests; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="PostgreSQL URL for the gateway (else SQLite)")
    parser.add_argument("--stream", action="store_true", help="time 20-chunk streams")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warm-up", type=int, default=300, help="requests served uncounted")
    args = parser.parse_args(argv)
    from gevent import monkey

    monkey.patch_all()
    scratch = Path(tempfile.mkdtemp(prefix="bench-phases-"))
    port = free_port()
    with running(upstream_command(port), dict(os.environ), port, scratch / "upstream.log"):
        print("\n".join(serve(args, port, scratch)))


if __name__ == "__main__":
    main()
